{{/* Labels every object carries. */}}
{{- define "gpuslice.labels" -}}
app.kubernetes.io/part-of: gpuslice
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* An image reference: images.registry, then the repository, then the tag (appVersion when empty). */}}
{{- define "gpuslice.image" -}}
{{- $image := index .root.Values.images .name -}}
{{- $tag := $image.tag | default .root.Chart.AppVersion -}}
{{- if and .root.Values.images.registry (ne .name "scheduler") -}}
{{ printf "%s/%s:%s" (trimSuffix "/" .root.Values.images.registry) $image.repository $tag }}
{{- else -}}
{{ printf "%s:%s" $image.repository $tag }}
{{- end -}}
{{- end -}}

{{/* The extender Service's DNS name: what the serving certificate carries and clients verify. */}}
{{- define "gpuslice.serviceHost" -}}
gpuslice-extender.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* The webhook's Service (every ready extender replica), a name the serving certificate holds too. */}}
{{- define "gpuslice.webhookHost" -}}
gpuslice-webhook.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* Product names of the catalog, as a CEL list literal: ['v100-25', 'v100-50']. */}}
{{- define "gpuslice.celProducts" -}}
[{{- range $i, $p := .Values.catalog.products }}{{ if $i }}, {{ end }}'{{ $p.name }}'{{ end -}}]
{{- end -}}

{{/* Product names of fractional products (less than a whole card), as a CEL list literal. */}}
{{- define "gpuslice.celFractional" -}}
[{{- $first := true }}{{ range .Values.catalog.products }}{{ if lt (int .milli) 1000 }}{{ if not $first }}, {{ end }}'{{ .name }}'{{ $first = false }}{{ end }}{{ end -}}]
{{- end -}}

{{/* The catalog's offer, for messages: "v100-25, v100-50, v100-100". */}}
{{- define "gpuslice.productList" -}}
{{- $names := list -}}{{- range .Values.catalog.products }}{{ $names = append $names .name }}{{ end -}}
{{ join ", " $names }}
{{- end -}}

{{/* Namespaces exempt from the webhook and the admission policies: the release's (ns) and the listed ones (extra). */}}
{{- define "gpuslice.exempt" -}}
{{- $list := list .ns -}}
{{- range .extra }}{{ if not (has . $list) }}{{ $list = append $list . }}{{ end }}{{ end -}}
{{ toJson $list }}
{{- end -}}

{{/* The extender's identity in the API (its ServiceAccount): the one writer of allocation records. */}}
{{- define "gpuslice.extenderUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpuslice-extender
{{- end -}}

{{/* The extender's weight in the scheduler profile: set, or by mode (deploy/README.md). */}}
{{- define "gpuslice.extenderWeight" -}}
{{- if kindIs "invalid" .Values.scheduler.extenderWeight -}}
{{ if eq .Values.mode "cooperative" }}150{{ else }}20{{ end }}
{{- else -}}
{{ .Values.scheduler.extenderWeight }}
{{- end -}}
{{- end -}}

{{/* A pod securityContext for our non-root components. */}}
{{- define "gpuslice.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The pod of the certificate Job and CronJob: `gpuslice certs` in the extender's image. */}}
{{- define "gpuslice.certsPod" -}}
metadata:
  labels:
    {{- include "gpuslice.labels" . | nindent 4 }}
    app.kubernetes.io/name: gpuslice-certs
spec:
  serviceAccountName: gpuslice-certs
  restartPolicy: OnFailure
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: certs
      image: {{ include "gpuslice.image" (dict "root" . "name" "extender") }}
      imagePullPolicy: {{ .Values.images.extender.pullPolicy }}
      command:
        - gpuslice
        - certs
        - --namespace
        - {{ .Release.Namespace }}
        - --ca-days
        - {{ .Values.tls.bootstrap.caDays | quote }}
        - --leaf-days
        - {{ .Values.tls.bootstrap.leafDays | quote }}
        - --renew-within-days
        - {{ .Values.tls.bootstrap.renewWithinDays | quote }}
        - --san  # the webhook's Service: kube-apiserver checks this name
        - {{ include "gpuslice.webhookHost" . }}
        - --wait-webhook
        - "300"
        - --restart
      env:
        - name: HOME
          value: /tmp
      resources:
        requests: {cpu: 50m, memory: 64Mi}
        limits: {memory: 256Mi}
      securityContext:
        {{- include "gpuslice.restricted" . | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: tmp
      emptyDir:
        medium: Memory
        sizeLimit: 16Mi
{{- end -}}

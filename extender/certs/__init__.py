"""``gpuslice certs``: the CA and the certificates of gpuslice's mutual TLS, in Secrets."""

# The managed plugin's rootfs: nothing but the static binary (CGO_ENABLED=0,
# see `make build`). FROM scratch needs no registry. `make plugin` does not
# need this file (it copies the binary into the rootfs directly); with
# USE_DOCKER_BUILD=1 it builds the rootfs from here instead:
#
#     make build && docker build -t calico-cnm-rootfs .
#
# config.json (the plugin manifest) holds the entrypoint, mounts and env.
FROM scratch
COPY bin/calico-cnm /calico-cnm
ENTRYPOINT ["/calico-cnm"]
CMD ["serve", "--single-socket", "calico.sock"]

# fusebox image: the collectors and the fuse service, for docker-compose.yml and the generated
# Kubernetes manifests (k8s/). The entry point is the fusebox CLI: run it with `collect gpu ...`
# or `fuse serve ...`, as user 10001 (non-root; the manifests' runAsUser).
# The base image is pinned by tag only: no container registry was reachable where this file was
# last edited, so its digest could not be looked up (none is made up here). To pin it, take the
# index digest from `docker buildx imagetools inspect python:3.11.11-slim-bookworm` and write
# FROM python:3.11.11-slim-bookworm@sha256:<digest>.
FROM python:3.11.11-slim-bookworm
WORKDIR /src
# Dependencies from the hash-pinned lock first (this layer is reused until the lock changes);
# then fusebox itself without resolving anything (`make lock` refreshes the lock).
COPY requirements/runtime.lock requirements/runtime.lock
RUN pip install --no-cache-dir --require-hashes -r requirements/runtime.lock
COPY pyproject.toml README.md* ./
COPY fusebox ./fusebox
COPY generator ./generator
COPY collectors ./collectors
COPY fuse ./fuse
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && useradd --system --uid 10001 --user-group fusebox \
    && mkdir -p /var/lib/fusebox && chown 10001:10001 /var/lib/fusebox
# numeric, so Kubernetes' runAsNonRoot can check it
USER 10001
WORKDIR /var/lib/fusebox
ENTRYPOINT ["fusebox"]
CMD ["--help"]

# fusebox image for docker-compose.yml (collectors and fuse service).
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
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && useradd --system --uid 10001 fusebox && mkdir -p /var/lib/fusebox && chown fusebox /var/lib/fusebox
USER fusebox
WORKDIR /var/lib/fusebox

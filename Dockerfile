# fusebox image for docker-compose.yml (collectors and fuse service).
FROM python:3.11.11-slim-bookworm
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY fusebox ./fusebox
COPY generator ./generator
COPY collectors ./collectors
COPY fuse ./fuse
RUN pip install --no-cache-dir . && useradd --system --uid 10001 fusebox && mkdir -p /var/lib/fusebox && chown fusebox /var/lib/fusebox
USER fusebox
WORKDIR /var/lib/fusebox

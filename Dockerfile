# ratewarden serve, as a drop-in image for envoyproxy/ratelimit (docs/gateways/envoy.md, "Moving from
# envoyproxy/ratelimit"). Two stages: the wheel is built with mypyc and the compiled front door (Rust,
# rust/), then installed alone in a slim Python. By default the container runs
# `ratewarden serve --envoy-env`: the reference's environment variables and runtime directory, its ports
# (8080 HTTP, 8081 gRPC, 9090 Prometheus with USE_PROMETHEUS=true). `/bin/ratelimit` is the same command,
# for a Deployment that keeps the reference's `command: ["/bin/ratelimit"]`.
#
#   docker build -t ratewarden .
#   docker run --rm -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL=redis:6379 -e RUNTIME_ROOT=/data \
#     -e RUNTIME_SUBDIRECTORY=ratelimit -e RUNTIME_WATCH_ROOT=false -v $PWD/config:/data/ratelimit/config ratewarden
#
# Other arguments replace `--envoy-env` (e.g. `docker run ratewarden policy.toml --http :8080`).
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain stable
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE CHANGELOG.md ./
COPY rust ./rust
COPY src ./src
# Both required: a wheel without mypyc's modules or without ratewarden._front fails the build.
RUN pip install --no-cache-dir build \
 && RATEWARDEN_REQUIRE_COMPILED=1 RATEWARDEN_REQUIRE_FRONT=1 python -m build --wheel --outdir /dist .

FROM python:${PYTHON_VERSION}-slim
COPY --from=build /dist/ /tmp/dist/
RUN wheel="$(ls /tmp/dist/ratewarden-*.whl)" \
 && pip install --no-cache-dir "${wheel}[serve,redis,memcached]" \
 && rm -rf /tmp/dist \
 && printf '#!/bin/sh\nexec ratewarden serve --envoy-env "$@"\n' > /bin/ratelimit && chmod 755 /bin/ratelimit \
 && useradd --system --uid 10001 --no-create-home ratewarden \
 && ratewarden serve --version
USER 10001
EXPOSE 8080 8081 9090
ENTRYPOINT ["ratewarden", "serve"]
CMD ["--envoy-env"]

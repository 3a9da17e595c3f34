# tandem-agent image: builds the project on Debian 12 and keeps only the binaries.
FROM debian:bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends make git ca-certificates sudo
WORKDIR /src
COPY . .
RUN make deps && make build

FROM debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends \
      libucx0 libpcre2-8-0 libutf8proc2 libxxhash0 libyaml-cpp0.7 libssl3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/tandem-agent /src/build/bin/tandem-model /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/tandem-agent"]

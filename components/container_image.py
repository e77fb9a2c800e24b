"""ContainerImage: build a context under workloads/ with BuildKit and push it, or use a prebuilt reference.

The output `ref` is the pushed image pinned by digest (`HOST/PROJECT/REPO/NAME@sha256:...`), so a
workload never runs a tag that moved.
"""

from __future__ import annotations

import msgspec
import pulumi
import pulumi_docker_build as docker_build
import pulumi_gcp as gcp

from model.types import ImageConfig

# Artifact Registry's user name for an OAuth access token.
GCP_TOKEN_USER = "oauth2accesstoken"


class ContainerImageArgs(msgspec.Struct, frozen=True):
    config: ImageConfig
    registry_host: str
    repository_url: pulumi.Input[str]
    build_args: dict[str, str] = msgspec.field(default_factory=dict)  # Dockerfile ARGs (e.g. the pinned base image)
    # The push login: the deploying identity's Google OAuth token (Artifact Registry) unless a password is
    # given; with `username` None and no password, the build host's own docker login.
    username: str | None = GCP_TOKEN_USER
    password: pulumi.Input[str] | None = None


class ContainerImage(pulumi.ComponentResource):
    def __init__(self, name: str, args: ContainerImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:gcp:ContainerImage", name, None, opts)
        cfg = args.config
        if cfg.prebuilt:
            self.ref: pulumi.Output[str] = pulumi.Output.from_input(cfg.prebuilt)
        else:
            # `repository@digest`: the image's `ref` output keeps the tag too (`repo:tag@sha256:...`); the
            # digest alone is what pins it, so that is what workloads get.
            image = self._build(name, args)
            self.ref = pulumi.Output.all(args.repository_url, image.digest).apply(
                lambda v: f"{v[0]}/{cfg.name}@{v[1]}")
        self.register_outputs({"ref": self.ref})

    def _build(self, name: str, args: ContainerImageArgs) -> docker_build.Image:
        cfg = args.config
        # Relative to the project folder, where Pulumi runs the program: the plan stays machine-independent.
        context = cfg.context.rstrip("/")
        repo = pulumi.Output.from_input(args.repository_url).apply(lambda url: f"{url}/{cfg.name}")
        tag = repo.apply(lambda r: f"{r}:{cfg.tag}")
        # Layers cached in the registry itself (an image manifest Artifact Registry accepts), so a build on a
        # fresh CI runner does not start a multi-GB CUDA image from nothing.
        cache = repo.apply(lambda r: f"{r}:buildcache")
        return docker_build.Image(
            f"{name}-build",
            context=docker_build.BuildContextArgs(location=context),
            dockerfile=docker_build.DockerfileArgs(location=f"{context}/Dockerfile"),
            platforms=[docker_build.Platform(cfg.platform)],
            build_args=dict(args.build_args) or None,
            tags=[tag],
            push=True,
            cache_from=[docker_build.CacheFromArgs(registry=docker_build.CacheFromRegistryArgs(ref=cache))],
            cache_to=[docker_build.CacheToArgs(registry=docker_build.CacheToRegistryArgs(
                ref=cache, mode=docker_build.CacheMode.MAX, image_manifest=True, oci_media_types=True))],
            # `pulumi preview` (every pull request) does not build; `pulumi up` does. The Dockerfile is linted
            # by hadolint in the tests.
            build_on_preview=False,
            registries=self._login(args),
            opts=pulumi.ResourceOptions(parent=self),
        )

    @staticmethod
    def _login(args: ContainerImageArgs) -> list[docker_build.RegistryArgs] | None:
        if args.password is not None and args.username:
            return [docker_build.RegistryArgs(address=args.registry_host, username=args.username,
                                              password=pulumi.Output.secret(args.password))]
        if args.username != GCP_TOKEN_USER:
            return None  # the build host's docker login
        # Short-lived OAuth token of the deploying identity; a secret so it never shows in plain text.
        token = pulumi.Output.secret(gcp.organizations.get_client_config_output().access_token)
        return [docker_build.RegistryArgs(address=args.registry_host, username=GCP_TOKEN_USER, password=token)]

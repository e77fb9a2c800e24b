"""The image pull Secret of a workload on a private registry: `kubernetes.io/dockerconfigjson` from the stack's
registry credentials (`gaudiImage.username` and the secret `registryPassword`), a Pulumi secret end to end."""

from __future__ import annotations

import base64
import json

import msgspec
import pulumi
import pulumi_kubernetes as k8s

DOCKER_CONFIG_KEY = ".dockerconfigjson"


class RegistryLogin(msgspec.Struct, frozen=True):
    host: str  # the registry's host[:port], as docker keys its credentials
    username: str
    password: pulumi.Output[str]


def name(job: str) -> str:
    return f"{job}-registry"


def docker_config(host: str, username: str, password: str) -> str:
    """The JSON a kubernetes.io/dockerconfigjson Secret holds (what `kubectl create secret docker-registry` writes)."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return json.dumps({"auths": {host: {"username": username, "password": password, "auth": auth}}})


def secret(resource_name: str, secret_name: str, namespace: pulumi.Input[str], labels: dict[str, str],
           login: RegistryLogin, opts: pulumi.ResourceOptions) -> k8s.core.v1.Secret:
    config = pulumi.Output.secret(pulumi.Output.from_input(login.password).apply(
        lambda password: docker_config(login.host, login.username, password)))
    return k8s.core.v1.Secret(
        resource_name,
        metadata=k8s.meta.v1.ObjectMetaArgs(name=secret_name, namespace=namespace, labels=labels),
        type="kubernetes.io/dockerconfigjson",
        string_data={DOCKER_CONFIG_KEY: config},
        opts=opts,
    )

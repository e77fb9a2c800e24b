"""GpuFabric: what a GPU fabric needs inside the cluster, per fabric set (model/fabric.py).

- One `GKENetworkParamSet` + `Network` (`networking.gke.io/v1`, cluster-scoped) per extra NIC: the names pods
  put in their `networking.gke.io/interfaces` annotation (Cluster Toolkit's gke-cluster templates).
- The NCCL plugin installer DaemonSet of the fabric and, for TCPX/TCPXO, the NRI device injector, applied
  from container-engine-accelerators at the pinned commit. Like the MPI operator, `yaml.v2.ConfigFile` lets
  the Kubernetes provider fetch the manifest during `pulumi up`; the program never downloads it.

Workloads on a fabric pool depend on this component, so their NICs and libraries exist before pods start.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
import pulumi
import pulumi_kubernetes as k8s

from model.fabric import FabricSet
from model.fabric import load as load_fabrics

API_VERSION = "networking.gke.io/v1"
PARAM_SET_KIND = "GKENetworkParamSet"
NETWORK_KIND = "Network"


class Nic(Protocol):
    """One extra NIC (components/fabric_network.py's NicNetwork): its Network name, device mode, VPC and subnet."""

    nic: str
    device_mode: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]


class GpuFabricArgs(msgspec.Struct, frozen=True):
    fabric_set: FabricSet
    nics: list[Nic]
    install: bool  # apply the installer (and NRI injector); a config check refuses a fabric pool without it


def param_set_spec(vpc: str, subnet: str, device_mode: str) -> dict[str, Any]:
    return {"vpc": vpc, "vpcSubnet": subnet, "deviceMode": device_mode}


def network_spec(param_set: str) -> dict[str, Any]:
    return {"type": "Device",
            "parametersRef": {"group": "networking.gke.io", "kind": PARAM_SET_KIND, "name": param_set}}


def manifest_urls(fabric_set: FabricSet) -> dict[str, str]:
    """The pinned manifests this fabric applies: its installer, and the NRI injector where it has a daemon."""
    cat = load_fabrics()
    urls = {"installer": cat.url(fabric_set.fabric.installer.manifest)}
    if fabric_set.fabric.nri:
        urls["nri"] = cat.url(cat.nri_manifest)
    return urls


class GpuFabric(pulumi.ComponentResource):
    def __init__(self, name: str, args: GpuFabricArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("deepspeed-stack:workloads:GpuFabric", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.objects: list[k8s.apiextensions.CustomResource] = []
        self.manifests: list[k8s.yaml.v2.ConfigFile] = []
        for nic in args.nics:
            labels = {"app.kubernetes.io/managed-by": "pulumi", "deepspeed-stack/fabric": args.fabric_set.fabric.name}
            param_set = k8s.apiextensions.CustomResource(
                f"{name}-{nic.nic}-params",
                api_version=API_VERSION, kind=PARAM_SET_KIND,
                metadata=k8s.meta.v1.ObjectMetaArgs(name=nic.nic, labels=labels),
                spec=pulumi.Output.all(nic.network, nic.subnetwork).apply(
                    lambda v, mode=nic.device_mode: param_set_spec(v[0], v[1], mode)),
                # Fixed cluster-wide names: the old object goes before its replacement is created.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
            network = k8s.apiextensions.CustomResource(
                f"{name}-{nic.nic}-network",
                api_version=API_VERSION, kind=NETWORK_KIND,
                metadata=k8s.meta.v1.ObjectMetaArgs(name=nic.nic, labels=labels),
                spec=network_spec(nic.nic),
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=[param_set]),
            )
            self.objects += [param_set, network]
        urls = manifest_urls(args.fabric_set) if args.install else {}
        for part, url in urls.items():
            self.manifests.append(k8s.yaml.v2.ConfigFile(f"{name}-{part}", file=url, opts=child))
        self.register_outputs({"fabric": args.fabric_set.fabric.name, "networks": [n.nic for n in args.nics],
                               "manifests": urls})

"""The folders a Gaudi MPIJob's ranks write on the shared claim (the caches, the checkpoints and the model, or the
trainer's output), and the launcher's first lines that make each one and write-test it as the ranks' user, or stop
naming the folder in the way and the one command an admin runs on the NFS server to fix it (checks/gaudi.py says the
same before the run).
"""

from __future__ import annotations

from model.types import MpiJobWorkloadConfig
from workloads import pod_security
from workloads.mpijob.gaudi_env import recipe_roots
from workloads.mpijob.shape import quote_args

GAUDI_RANKS_USER = pod_security.GAUDI_USER  # the stack's Gaudi image's user and group (workloads/images/gaudi)


def output_dir(w: MpiJobWorkloadConfig) -> str:
    """Where the trainer writes its checkpoints and the adapter: beside the caches, in the ranks' folder."""
    return f"{w.output_root}/output/{w.name}"


def ranks_folders(w: MpiJobWorkloadConfig) -> list[tuple[str, str]]:
    """The folders the ranks write, each with the folder an admin makes for them when they cannot: the ranks'
    own folder for what lies in it, else (an `hfHome` elsewhere on the claim) that folder itself."""
    mount, own = w.storage.mount_path.rstrip("/"), w.ranks_root.rstrip("/")

    def for_admin(folder: str) -> str:
        return own if folder == own or folder.startswith(own + "/") else folder

    return [(folder, for_admin(folder)) for folder in (w.cache_home, *outputs(w)) if folder.startswith(mount)]


def outputs(w: MpiJobWorkloadConfig) -> list[str]:
    """What the run writes besides the caches: the recipe's checkpoints and model, or the trainer's --output_dir."""
    if w.finetune is not None:
        where = recipe_roots(w)
        return [where.checkpoint_dir, where.model_dir]
    return [output_dir(w)]


def nfs_folder_hint(w: MpiJobWorkloadConfig) -> str:
    """How an admin finds the claim's folder on the NFS server (an NFS volume: its PersistentVolume's nfs.path;
    nfs-subdir-external-provisioner, Omnia's nfs-client, makes one folder per claim)."""
    volume = f"$(kubectl get pvc -n {w.namespace} {w.storage.claim_name} -o jsonpath={{.spec.volumeName}})"
    return f'kubectl get pv "{volume}" -o jsonpath={{.spec.nfs.path}}'


def relative(w: MpiJobWorkloadConfig, folder: str) -> str:
    """A folder of the claim as a path in it ("" for its root)."""
    return folder[len(w.storage.mount_path.rstrip("/")):].strip("/")


def admin_command(w: MpiJobWorkloadConfig, rel: str) -> str:
    """The one command, on the NFS server, that gives the ranks a folder of the claim (CLAIM: the claim's folder)."""
    user = f"{GAUDI_RANKS_USER}:{GAUDI_RANKS_USER}"
    return f'mkdir -p "$CLAIM/{rel}" && chown -R {user} "$CLAIM/{rel}"'


def in_double_quotes(text: str) -> str:
    """Text as the inside of a shell double-quoted string prints it: nothing expanded."""
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


# The launcher's first lines (shellcheck-clean; tests run them on a temporary claim): make each folder the ranks
# write and write a probe file in it as the ranks' user, or stop at once naming the folder in the way, its owner and
# the admin's command, instead of every rank failing after the model's download.
def writable_folders_check(w: MpiJobWorkloadConfig) -> str:
    """The ranks' folders made and write-tested as the ranks' user before anything else."""
    fix = in_double_quotes(admin_command(w, "FOLDER")).replace("FOLDER", "$2")  # the folder: the 2nd argument
    hint = in_double_quotes(nfs_folder_hint(w))
    return "\n".join([
        'ranks_folder() {  # $1: a folder the ranks write; $2: the folder, relative to the claim, an admin makes',
        '  if mkdir -p "$1" 2>/dev/null && touch "$1/.deepspeed-stack-write-test" 2>/dev/null; then',
        '    rm -f "$1/.deepspeed-stack-write-test"; return 0',
        "  fi",
        '  top="$1"; while [ ! -e "$top" ]; do top=$(dirname "$top"); done',
        '  echo "$1: uid $(id -u) cannot write $top (owner $(stat -c %u:%g "$top")): another run made it first" \\',
        '    "(Omnia\'s by-hand run is root), or the claim\'s root is not open to the ranks. On the NFS server," \\',
        f'    "run once \\`{fix}\\`, CLAIM being the claim\'s folder there (\\`{hint}\\`): NFS volumes take no" \\',
        '    "fsGroup, and root_squash stops a root pod\'s chown" >&2',
        "  exit 1",
        "}",
        *(f"ranks_folder {quote_args([folder, relative(w, admin)])}" for folder, admin in ranks_folders(w)),
    ])

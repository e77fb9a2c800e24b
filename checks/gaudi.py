"""Pre-deploy checks of the Gaudi image and its registry, and the Gaudi warnings, one function per rule."""

from __future__ import annotations

from checks.common import Check, at
from components import gaudi_image
from model import gaudi_software
from model.problems import Problem
from model.types import MpiJobWorkloadConfig, StackConfig, WorkloadConfig
from recipes import finetune_hpu
from workloads.mpijob import gaudi_folders


def versions(w: WorkloadConfig) -> tuple[str, str, str, str]:
    """What goes into the Gaudi image: software, OS, PyTorch and optimum-habana versions."""
    g = w.gaudi
    return g.software_version, g.os, g.pytorch_version, w.training.optimum_habana_version


def what_to_use(w: MpiJobWorkloadConfig) -> str:
    """For a Gaudi software, OS and PyTorch with no pinned base image: the keys that would pick a pinned one."""
    g, key = w.gaudi, at("workloads", w.name, "gaudi")
    same = [b for b in gaudi_software.base_images() if b.software_version == g.software_version]
    if same:
        pairs = " or ".join(f"os {b.os} with pytorchVersion {b.pytorch}" for b in same)
        return f"Gaudi software {g.software_version} is pinned with {pairs}: set {key}.os and {key}.pytorchVersion"
    releases = sorted({b.software_version for b in gaudi_software.base_images()}, key=gaudi_software.version_tuple)
    return (f"use a pinned release ({', '.join(releases)}: the one your nodes' Habana driver runs, with its os and "
            f"pytorchVersion)")


def check_gaudi_base_image(m: StackConfig) -> list[Problem]:
    """The stack builds only on a base image pinned in data/gaudi_software.yaml; the message names what is."""
    if m.gaudi_image.prebuilt:
        return []
    known = ", ".join(f"{b.software_version}/{b.os}/pytorch {b.pytorch}" for b in gaudi_software.base_images())
    return [Problem(at('workloads', w.name, 'gaudi', 'softwareVersion'), f"no pinned Habana base image for "
            f"{w.gaudi.software_version}/{w.gaudi.os}/pytorch {w.gaudi.pytorch_version} in data/gaudi_software.yaml "
            f"(known: {known}); {what_to_use(w)}, or record it there, set gaudiImage.prebuilt, or set "
            f"workloads.{w.name}.image")
            for w in gaudi_image.workloads_on_it(m) if gaudi_software.base_image(w.gaudi) is None]


def installs_optimum_habana(m: StackConfig) -> list[MpiJobWorkloadConfig]:
    """Gaudi MPIJobs whose optimum-habana the stack installs: into the Gaudi image it builds, or at every start."""
    # A build with no pinned base image is refused by check_gaudi_base_image already.
    built = [w for w in ([] if m.gaudi_image.prebuilt else gaudi_image.workloads_on_it(m))
             if gaudi_software.base_image(w.gaudi) is not None]
    at_start = [w for w in m.workloads.values() if isinstance(w, MpiJobWorkloadConfig) and w.installs_at_start
                and not w.image]
    return [*built, *at_start]


def optimum_habana_mismatch(w: MpiJobWorkloadConfig) -> tuple[str, ...]:
    """The releases validated with the workload's Gaudi software when its optimum-habana is none of them (empty:
    it matches, or nothing is recorded for that software: the base-image rule speaks for an unknown release)."""
    matching = gaudi_software.optimum_habana_for(w.gaudi.software_version)
    return () if not matching or w.training.optimum_habana_version in matching else matching


def check_optimum_habana_release(m: StackConfig) -> list[Problem]:
    """optimum-habana is validated against one Gaudi software release (data/gaudi_software.yaml): another one
    fails late (after a long image build) or misbehaves at run time."""
    return [Problem(at('workloads', w.name, 'training', 'optimumHabanaVersion'), f"{w.training.optimum_habana_version} "
            f"is not validated with Gaudi software {w.gaudi.software_version} (workloads.{w.name}.gaudi."
            f"softwareVersion); use {' or '.join(matching)} (optimum-habana's README at each release, "
            "data/gaudi_software.yaml)")
            for w in installs_optimum_habana(m) if (matching := optimum_habana_mismatch(w))]


def recipe_releases(software_version: str) -> str:
    """The releases validated with this Gaudi software that run the recipe, or what to move to where none does."""
    validated = gaudi_software.optimum_habana_for(software_version)
    fit = [r.release for r in gaudi_software.optimum_habana_releases() if gaudi_software.runs_the_recipe(r)]
    usable = [release for release in validated if release in fit]
    if usable:
        return f"use {' or '.join(usable)}"
    first = next(r for r in gaudi_software.optimum_habana_releases() if r.release == fit[0])
    return (f"no release validated with Gaudi software {software_version} does: {fit[0]} and later do (Gaudi "
            f"software {first.gaudi} and later)")


def check_recipe_transformers(m: StackConfig) -> list[Problem]:
    """finetune.py runs on the transformers that the image's optimum-habana installs: a release that pins one older
    than the recipe runs on (data/gaudi_software.yaml recipeOnGaudi) would fail at its first step, after the build.
    A release refused for its Gaudi software already is that rule's problem alone."""
    out = []
    for w in installs_optimum_habana(m):
        r = gaudi_software.release_named(w.training.optimum_habana_version)
        if w.finetune is None or optimum_habana_mismatch(w) or r is None or gaudi_software.runs_the_recipe(r):
            continue
        out.append(Problem(at('workloads', w.name, 'training', 'optimumHabanaVersion'),
                           f"{r.release} installs transformers "
                   f"{r.transformers} (its setup.py); finetune.py ({at('workloads', w.name, 'finetune')}) runs on "
                   f"transformers {gaudi_software.recipe_min_transformers()} and later; "
                   f"{recipe_releases(w.gaudi.software_version)} (data/gaudi_software.yaml)"))
    return out


def check_one_gaudi_build(m: StackConfig) -> list[Problem]:
    """One Gaudi image per stack: the workloads that run it agree on what goes into it."""
    jobs = gaudi_image.workloads_on_it(m)
    if m.gaudi_image.prebuilt or len(jobs) < 2:
        return []
    first = jobs[0]
    # A refused optimum-habana release is check_optimum_habana_release's problem, not a second one here.
    return [Problem(at('workloads', w.name, 'gaudi'),
                    f"the stack builds one Gaudi image, from workloads.{first.name}'s "
            f"versions {'/'.join(versions(first))}; this workload asks for {'/'.join(versions(w))}. Use the same "
            "gaudi versions and training.optimumHabanaVersion, or give it an `image` of its own")
            for w in jobs[1:] if versions(w) != versions(first) and not optimum_habana_mismatch(w)]


def check_gaudi_registry(m: StackConfig) -> list[Problem]:
    """Without Google Cloud settings the image needs a registry the cluster can reach."""
    jobs = gaudi_image.workloads_on_it(m)
    if not jobs or m.gaudi_image.prebuilt or gaudi_image.uses_artifact_registry(m) or m.gaudi_image.registry:
        return []
    return [Problem("gaudiImage.registry", f"required: the stack has no gcp:project, so the Gaudi image of "
            f"workloads.{jobs[0].name} is pushed to a registry the cluster can pull from; set gaudiImage.registry "
            "(e.g. registry.example.com/ml, with gaudiImage.username and the secret registryPassword if it needs a "
            "login), or gaudiImage.prebuilt, or workloads.<name>.image")]


def check_registry_login(m: StackConfig) -> list[Problem]:
    """The registry login is a pair: a user and its secret password."""
    if m.gaudi_image.username and m.registry_password is None:
        return [Problem("registryPassword", "required with gaudiImage.username; set it with "
                "`pulumi config set --secret registryPassword <password or token>`")]
    if m.registry_password is not None and not m.gaudi_image.username:
        return [Problem("gaudiImage.username", "required with registryPassword (the registry user it belongs to)")]
    return []


def padding_free_on_gaudi(w: WorkloadConfig) -> bool:
    """`finetune.packing: true` with records declared chat or prompt/completion: padding-free batches on HPU."""
    f = w.finetune if isinstance(w, MpiJobWorkloadConfig) else None
    return f is not None and bool(f.packing) and f.record_format not in ("auto", "text") and f.format != "text"


def check_packing_on_gaudi(m: StackConfig) -> list[Problem]:
    """finetune.py refuses padding-free batches on HPU at its data step (finetune_hpu.padding_free_problem, read
    from the script, not copied): with the records' format declared the stack knows before the run."""
    hpu = finetune_hpu
    return [Problem(at('workloads', w.name, 'finetune', 'packing'),
                    f"true packs {w.finetune.record_format} records into "
                    f"padding-free batches, which finetune.py refuses at its data step on Gaudi: "
                    f"{hpu.padding_free_problem('0', True)}")
            for w in m.workloads.values() if padding_free_on_gaudi(w) and w.on_gaudi]


CHECKS: list[Check] = [
    check_gaudi_base_image,
    check_one_gaudi_build,
    check_optimum_habana_release,
    check_recipe_transformers,
    check_gaudi_registry,
    check_registry_login,
    check_packing_on_gaudi,
]


def warn_ranks_folders(m: StackConfig) -> list[Problem]:
    """Where the hardened Gaudi ranks (uid 10001) write on a claim of an existing cluster, and the admin's one
    command should they not be able to: the stack cannot see the claim's owners before the launcher runs."""
    out = []
    for w in m.workloads.values():
        if not (isinstance(w, MpiJobWorkloadConfig) and w.runs_stack_gaudi_image and not w.launch.command):
            continue
        folders = gaudi_folders.ranks_folders(w)
        fixes = dict.fromkeys(gaudi_folders.admin_command(w, gaudi_folders.relative(w, admin)) for _, admin in folders)
        out.append(Problem(at('workloads', w.name, 'storage'), f"the ranks (uid {gaudi_folders.GAUDI_RANKS_USER}) "
                   f"keep the caches (HF_HOME {w.cache_home}) and the output ({', '.join(gaudi_folders.outputs(w))}) "
                   f"on claim {w.storage.claim_name}, making the folders they lack; confirm uid "
                   f"{gaudi_folders.GAUDI_RANKS_USER} can write there, or have the NFS server's admin run once "
                   f"`{'; '.join(fixes)}`, CLAIM being the claim's folder there "
                   f"(`{gaudi_folders.nfs_folder_hint(w)}`): NFS volumes take no fsGroup, and root_squash stops a root "
                   "pod's chown. Otherwise the launcher stops at once, naming the folder and its owner"))
    return out


def warn_padding_free(m: StackConfig) -> list[Problem]:
    """finetune.packing: true on Gaudi: text records are packed into blocks, but chat and prompt/completion records
    would go padding-free, which finetune.py refuses on HPU at its data step (finetune_hpu.padding_free_problem):
    with recordFormat auto the stack cannot see the records' format before the run (a declared one: refused or
    fine, check_packing_on_gaudi)."""
    return [Problem(at('workloads', w.name, 'finetune', 'packing'), "on Gaudi only text records are packed (into "
            "sequenceLength blocks); chat or prompt/completion records stop finetune.py at its data step, since "
            "padding-free batches are not proven with optimum-habana's attention: leave packing unset for them")
            for w in m.workloads.values()
            if isinstance(w, MpiJobWorkloadConfig) and w.finetune is not None and w.finetune.packing
            and w.finetune.record_format == "auto" and w.finetune.format != "text"]


def support_line(w: MpiJobWorkloadConfig) -> str:
    """Which path runs this workload's training for its Gaudi software, and that optimum-habana is out of support
    (data/gaudi_software.yaml `optimumHabana.endOfSupport`, `paths`)."""
    g, end, native = w.gaudi.software_version, gaudi_software.end_of_support(), gaudi_software.native_hpu()
    release = w.training.optimum_habana_version
    band = gaudi_software.path_for(g)
    what = "finetune.py through its GaudiTrainer" if w.finetune is not None else f"{w.training.script}"
    if band is not None and band.path == "optimum-habana-frozen":
        runs = (f"Gaudi software {g} runs {what} on optimum-habana {release}, frozen: {band.note} (Gaudi software "
                f"{band.first}-{band.last})")
    else:
        runs = f"Gaudi software {g} runs {what} on optimum-habana {release}, the release validated with it"
    return (Problem(at('workloads', w.name, 'gaudi', 'softwareVersion'),
                    f"{runs}. optimum-habana is out of support since "
            f"{end.date}: its final release {end.final_release} (Gaudi software {end.final_gaudi}) says no fixes are "
            "guaranteed and security issues may not be investigated, and names no replacement. The newest frozen "
            f"path is Gaudi software {end.final_gaudi} with {end.final_release}; transformers "
            f"{native['transformers']}+ and accelerate {native['accelerate']}+ run on HPU themselves (with Habana's "
            "DeepSpeed), a path the stack records but does not build yet (data/gaudi_software.yaml `paths`)"))


def warn_optimum_habana_support(m: StackConfig) -> list[Problem]:
    """Every Gaudi job whose optimum-habana the stack installs hears which path runs it and that the library is
    out of support (a refused release is its rule's problem alone)."""
    return [support_line(w) for w in installs_optimum_habana(m) if not optimum_habana_mismatch(w)
            and gaudi_software.release_named(w.training.optimum_habana_version) is not None]


def warnings(m: StackConfig) -> list[Problem]:
    """What deploys but must be confirmed: an unpinned base digest, the ranks' folders on the claim (the
    install-at-start opt-in: its kind's warning, workloads/kinds/mpijob.py), packing on Gaudi, optimum-habana's
    end of support."""
    out = warn_optimum_habana_support(m) + warn_ranks_folders(m) + warn_padding_free(m)
    if not m.gaudi_image.prebuilt:
        for w in gaudi_image.workloads_on_it(m)[:1]:
            base = gaudi_software.base_image(w.gaudi)
            if base is not None and base.digest is None:
                out.append(Problem(at('workloads', w.name, 'gaudi', 'softwareVersion'), f"the Habana base image "
                           f"{base.repository}:{base.tag} is pinned by tag only (digest unconfirmed); record its "
                           "digest in data/gaudi_software.yaml (`docker buildx imagetools inspect`)"))
    return out

"""finetune.py's run path under stand-ins for torch, torch.distributed, transformers, peft, datasets and accelerate
(none of them is installed here; `make e2e` runs the real ones on CPUs): the ranks' stop agreement, the export
(every rank saves, rank 0 merges a LoRA adapter, writes the tokenizer, then MODEL_DIR/.complete last) and main()'s
order. Ranks are threads; their collectives meet at a barrier, so a rank that skips one breaks the barrier and the
test fails instead of hanging."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import yaml

from recipes import contract as rc
from recipes import finetune_args as fa
from recipes import finetune_export as fe
from recipes import finetune_prepare as fp
from recipes import finetune_train as fr

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "recipes" / "finetune.py"
MARKER = ".complete"
STALE_MARKER = "an older model's marker"
BARRIER_TIMEOUT_S = 5.0  # only a broken test waits this long: a healthy collective meets in microseconds
# What the stand-in dtypes are called (torch.bfloat16 and so on).
DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
# The stand-ins are the recipe's transformers (data/versions.yaml); OLD_TRANSFORMERS the Gaudi image's with the
# default optimum-habana release (v1.15.0's setup.py: >=4.45.2,<4.46.0), whose keywords differ (finetune_hpu.py).
RECIPE_VERSIONS = yaml.safe_load((ROOT / "data" / "versions.yaml").read_text())["python"]
RECIPE_TRANSFORMERS = str(RECIPE_VERSIONS["transformers"])
OLD_TRANSFORMERS = "4.45.2"


@pytest.fixture(scope="module")
def ft() -> ModuleType:
    """finetune.py as the cluster imports it: its modules (finetune_*.py) found beside it."""
    from workloads.finetune import script_module

    return script_module("finetune")


# --- the simulated ranks and what they write -------------------------------------------------------------------

class World:
    """`size` ranks, one thread each (or the test's own thread for one rank). A collective is a barrier every rank
    must reach; `calls` lists who reached which."""

    def __init__(self, size: int, *, initialized: bool = True) -> None:
        self.size = size
        self.initialized = initialized
        self.calls: list[tuple[int, str]] = []
        self._barrier = threading.Barrier(size, timeout=BARRIER_TIMEOUT_S)
        self._slots: list[list[float]] = [[] for _ in range(size)]
        self._local = threading.local()
        self._lock = threading.Lock()

    @property
    def rank(self) -> int:
        return int(getattr(self._local, "rank", 0))

    def meet(self, name: str) -> None:
        with self._lock:
            self.calls.append((self.rank, name))
        self._barrier.wait()

    def all_reduce(self, values: list[float], combine: Callable[[tuple[float, ...]], float]) -> list[float]:
        self._slots[self.rank] = list(values)
        self.meet("all_reduce")
        combined = [combine(column) for column in zip(*self._slots, strict=True)]
        self._barrier.wait()  # all have read the others' values before any rank's next all_reduce overwrites its own
        return combined

    def run(self, body: Callable[[int], Any]) -> list[Any]:
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def rank_main(rank: int) -> None:
            self._local.rank = rank
            try:
                results[rank] = body(rank)
            except BaseException as error:  # re-raised in the test's thread below (an assert, a broken barrier)
                errors.append(error)
                self._barrier.abort()

        threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=BARRIER_TIMEOUT_S * 4)
        if errors:
            raise errors[0]
        assert not any(thread.is_alive() for thread in threads), "a rank never finished"
        return results


class Disk:
    """The files the stand-ins write, in the order written, each with whether a marker was in MODEL_DIR then. The
    script writes the marker itself: it is entered where first seen, which is before any later write."""

    def __init__(self, root: Path, model_dir: Path) -> None:
        self.root = root
        self.model_dir = model_dir
        self.log: list[tuple[str, bool]] = []
        self._marker_seen = False
        self._lock = threading.Lock()

    def _marker_present(self) -> bool:
        return (self.model_dir / MARKER).exists()

    def look(self) -> None:
        with self._lock:
            marker = self.model_dir / MARKER
            if not self._marker_seen and marker.is_file() and marker.read_text() != STALE_MARKER:
                self._marker_seen = True
                self.log.append((str(marker.relative_to(self.root)), True))

    def write(self, path: Path, text: str) -> None:
        self.look()
        with self._lock:
            self.log.append((str(path.relative_to(self.root)), self._marker_present()))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    def order(self) -> list[str]:
        self.look()
        return [name for name, _ in self.log]


# --- the stand-ins ------------------------------------------------------------------------------------------------

class FakeTensor:
    def __init__(self, values: Any, device: Any = None) -> None:
        self.values = list(values)
        self.device = device

    def item(self) -> Any:
        (value,) = self.values
        return value


class FakeModel:
    """A whole model: its weights are a sentence saying where they came from."""

    def __init__(self, fakes: Fakes, weights: str, dtype: Any = None) -> None:
        self.fakes, self.weights, self.dtype = fakes, weights, dtype
        self.config = SimpleNamespace(use_cache=True)  # a causal LM's default

    def enable_input_require_grads(self) -> None:
        self.fakes.events.append(("enable_input_require_grads",))

    def save_pretrained(self, path: str, safe_serialization: bool = True) -> None:
        self.fakes.events.append(("save_pretrained", self.weights, path, safe_serialization))
        self.fakes.disk.write(Path(path) / "model.safetensors", self.weights)
        self.fakes.disk.write(Path(path) / "config.json", json.dumps({"use_cache": self.config.use_cache}))


class FakePeftModel:
    """A base model with a LoRA adapter: saved, it is the adapter alone (peft's save_pretrained)."""

    def __init__(self, fakes: Fakes, base: FakeModel, adapter: str) -> None:
        self.fakes, self.base, self.adapter = fakes, base, adapter

    @property
    def config(self) -> Any:
        return self.base.config  # peft hands the base model's config through

    def save_pretrained(self, path: str, safe_serialization: bool = True) -> None:
        self.fakes.events.append(("save_pretrained", f"adapter {self.adapter}", path, safe_serialization))
        self.fakes.disk.write(Path(path) / "adapter_model.safetensors", self.adapter)
        self.fakes.disk.write(Path(path) / "adapter_config.json", "{}")

    def merge_and_unload(self) -> FakeModel:
        self.fakes.events.append(("merge_and_unload", self.adapter))
        return FakeModel(self.fakes, f"{self.base.weights} merged with adapter {self.adapter}", self.base.dtype)


class FakeTokenizer:
    """A character tokenizer (BOS 1, EOS 2, a character c -> 3 + ord(c) % 100) with no chat template: raw data."""

    eos_token = "</s>"
    eos_token_id = 2

    def __init__(self, fakes: Fakes) -> None:
        self.fakes = fakes
        self.pad_token: str | None = None
        self.chat_template: str | None = None

    def decode(self, ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)

    @property
    def pad_token_id(self) -> int | None:
        return self.eos_token_id if self.pad_token == self.eos_token else None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [1] * add_special_tokens + [3 + ord(c) % 100 for c in text]}

    def save_pretrained(self, path: str) -> None:
        self.fakes.disk.write(Path(path) / "tokenizer.json", "{}")
        self.fakes.disk.write(Path(path) / "tokenizer_config.json", "{}")


class FakeDataset:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        self._fingerprint = f"fake {len(records)} records"

    @property
    def column_names(self) -> list[str]:
        return list(self.records[0]) if self.records else []

    def __getitem__(self, key: int | str) -> Any:
        return self.records[key] if isinstance(key, int) else [record[key] for record in self.records]

    def map(self, fn: Callable[..., dict[str, Any]], remove_columns: list[str], desc: str,
            with_indices: bool = False, features: Any = None, num_proc: int | None = None) -> Any:
        return FakeDataset([fn(record, i) if with_indices else fn(record) for i, record in enumerate(self.records)])

    def iter(self, batch_size: int) -> Iterator[dict[str, list[Any]]]:
        for start in range(0, len(self.records), batch_size):
            chunk = self.records[start:start + batch_size]
            yield {name: [record[name] for record in chunk] for name in (chunk[0] if chunk else {})}

    def save_to_disk(self, path: str) -> None:
        """One JSON file (`datasets` writes Arrow files and its state): what load_from_disk reads back."""
        Path(path).mkdir(parents=True)
        (Path(path) / "records.json").write_text(json.dumps(self.records))

    @classmethod
    def from_generator(cls, generator: Callable[[], Iterator[dict[str, Any]]], features: Any = None,
                       cache_dir: str | None = None) -> FakeDataset:
        return cls(list(generator()))

    def remove_columns(self, names: list[str]) -> FakeDataset:
        return FakeDataset([{k: v for k, v in record.items() if k not in names} for record in self.records])

    def train_test_split(self, test_size: float, seed: int) -> dict[str, FakeDataset]:
        """The last records held out (datasets shuffles them with the seed first)."""
        held = max(1, round(len(self.records) * test_size))
        return {"train": FakeDataset(self.records[:-held]), "test": FakeDataset(self.records[-held:])}

    def filter(self, keep: Callable[[dict[str, Any]], bool]) -> FakeDataset:
        return FakeDataset([record for record in self.records if keep(record)])

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)


class FakeTrainer:
    """The Hugging Face Trainer as finetune.py uses it. save_model is collective (ZeRO-3 gathers the weights on
    every rank); the process of rank 0 writes the files, as the Trainer's should_save does."""

    def __init__(self, fakes: Fakes, model: Any, args: Any, train_dataset: Any = None, data_collator: Any = None,
                 processing_class: Any = None, callbacks: list[Any] | None = None, eval_dataset: Any = None) -> None:
        self.fakes, self.model, self.args = fakes, model, args
        self.train_dataset, self.data_collator, self.callbacks = train_dataset, data_collator, callbacks or []
        self.eval_dataset = eval_dataset
        self.rank = fakes.world.rank
        self.state = SimpleNamespace(global_step=0, max_steps=-1, num_input_tokens_seen=0, is_world_process_zero=True)
        self.accelerator = SimpleNamespace(wait_for_everyone=lambda: fakes.world.meet("wait_for_everyone"))
        self.batches: list[dict[str, Any]] = []
        fakes.trainers.append(self)
        fakes.events.append(("Trainer", len(self.callbacks)))

    def is_world_process_zero(self) -> bool:
        return self.rank == 0

    def evaluate(self) -> dict[str, float]:
        self.fakes.events.append(("evaluate", self.state.global_step, len(self.eval_dataset)))
        return {"eval_loss": 1.0}

    def save_model(self, output_dir: str) -> None:
        self.fakes.world.meet("save_model")
        if self.rank == 0:
            self.model.save_pretrained(output_dir)

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        """Steps to max_steps; SIGTERM arrives in step `fakes.sigterm_at_step`; after each step the callbacks
        decide, and a checkpoint is saved every save_steps or when they ask. As transformers 5.19's Trainer
        (_inner_training_loop, _run_epoch): the callbacks' on_train_begin once the checkpoint is loaded, and
        max_steps checked only after a step (DefaultFlowCallback.on_step_end), so a run resumed at its last step
        (its epoch with batches left) trains one more."""
        self.fakes.events.append(("train", resume_from_checkpoint))
        self.fakes.events.append(("use_cache while training", self.model.config.use_cache))
        if resume_from_checkpoint:
            self.state.global_step = int(Path(resume_from_checkpoint).name.removeprefix("checkpoint-"))
        self.state.max_steps = self.args.max_steps
        for callback in self.callbacks:
            callback.on_train_begin(self.args, self.state, SimpleNamespace())
        while True:
            self.batches.append(self.data_collator(list(self.train_dataset)[:2]))
            self.state.global_step += 1
            if self.state.global_step == self.fakes.sigterm_at_step:
                self.fakes.handlers[signal.SIGTERM](signal.SIGTERM, None)
            control = SimpleNamespace(should_save=False, should_training_stop=False)
            for callback in self.callbacks:
                control = callback.on_step_end(self.args, self.state, control)
            if control.should_save or self.state.global_step % self.args.save_steps == 0:
                folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
                self.fakes.disk.write(folder / "trainer_state.json", json.dumps({"step": self.state.global_step}))
            if control.should_training_stop or self.state.global_step >= self.args.max_steps:
                break


def _passes_control(self: Any, args: Any, state: Any, control: Any, **_: Any) -> Any:
    """The base TrainerCallback's hook, as the fake Trainer's loop calls it: control unchanged."""
    return control


class Fakes:
    """The modules finetune.py imports inside its functions, put in sys.modules; every call that matters is an
    event, in order."""

    def __init__(self, world: World, disk: Disk) -> None:
        self.world, self.disk = world, disk
        self.events: list[tuple[Any, ...]] = []
        self.trainers: list[FakeTrainer] = []
        self.handlers: dict[int, Any] = {}
        self.sigterm_at_step: int | None = None
        self.hub: dict[str, list[dict[str, Any]]] = {}  # Hugging Face dataset id: its records
        self.transformers_version = RECIPE_TRANSFORMERS

    def event_names(self) -> list[str]:
        return [event[0] for event in self.events]

    def modules(self) -> dict[str, ModuleType]:
        fakes = self
        reducers = {"MAX": max, "MIN": min, "SUM": sum}

        def all_reduce(tensor: FakeTensor, op: str = "SUM") -> None:
            tensor.values = fakes.world.all_reduce(tensor.values, reducers[op])

        def destroy_process_group() -> None:
            fakes.events.append(("destroy_process_group",))
            fakes.world.initialized = False

        dist = module("torch.distributed", all_reduce=all_reduce, destroy_process_group=destroy_process_group,
                      ReduceOp=SimpleNamespace(MAX="MAX", MIN="MIN", SUM="SUM", PRODUCT="PRODUCT", AVG="AVG"),
                      is_available=lambda: True, is_initialized=lambda: fakes.world.initialized,
                      barrier=lambda: fakes.world.meet("barrier"))
        torch = module("torch", distributed=dist, tensor=lambda data, device=None: FakeTensor(data, device),
                       **{dtype.removeprefix("torch."): dtype for dtype in DTYPES.values()})

        class TrainingArguments:
            def __init__(self, **kwargs: Any) -> None:
                fakes.events.append(("TrainingArguments", kwargs))
                self.__dict__.update(kwargs)
                self.world_size, self.process_index, self.device = fakes.world.size, fakes.world.rank, "cpu"

            @contextlib.contextmanager
            def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
                """Rank 0's body first, the others' after it (transformers': a barrier before theirs, after its)."""
                fakes.events.append(("main_process_first", local))
                if fakes.world.rank != 0:
                    fakes.world.meet("main_process_first")
                try:
                    yield
                finally:
                    if fakes.world.rank == 0:
                        fakes.world.meet("main_process_first")

        def tokenizer_from_pretrained(name: str, token: str | None = None) -> FakeTokenizer:
            fakes.events.append(("AutoTokenizer.from_pretrained", name, token))
            return FakeTokenizer(fakes)

        def model_from_pretrained(name: str, token: str | None = None, **kwargs: Any) -> FakeModel:
            # transformers 4.45 reads torch_dtype and hands any other keyword to the model's __init__ (a TypeError).
            dtype = kwargs.pop("torch_dtype" if fakes.transformers_version == OLD_TRANSFORMERS else "dtype", None)
            if kwargs:
                raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
            fakes.events.append(("AutoModelForCausalLM.from_pretrained", name, dtype, token))
            return FakeModel(fakes, f"base {name}", dtype)

        def trainer(**kwargs: Any) -> FakeTrainer:
            if fakes.transformers_version == OLD_TRANSFORMERS:  # 4.45's Trainer: tokenizer=, no processing_class
                kwargs["processing_class"] = kwargs.pop("tokenizer")
            return FakeTrainer(fakes, **kwargs)

        hf_deepspeed = module("transformers.integrations.deepspeed",
                              unset_hf_deepspeed_config=lambda: fakes.events.append(("unset_hf_deepspeed_config",)))
        integrations = module("transformers.integrations", deepspeed=hf_deepspeed)
        transformers = module("transformers", integrations=integrations, TrainingArguments=TrainingArguments,
                              TrainerCallback=type("TrainerCallback", (), {"on_step_end": _passes_control,
                                                                             "on_train_begin": _passes_control}),
                              AutoTokenizer=SimpleNamespace(from_pretrained=tokenizer_from_pretrained),
                              AutoModelForCausalLM=SimpleNamespace(from_pretrained=model_from_pretrained),
                              Trainer=trainer, __version__=fakes.transformers_version)

        def peft_from_pretrained(base: FakeModel, path: str) -> FakePeftModel:
            fakes.events.append(("PeftModel.from_pretrained", base.weights, path,
                                 (Path(path) / "adapter_config.json").is_file()))
            return FakePeftModel(fakes, base, path)

        def get_peft_model(model: FakeModel, config: Any) -> FakePeftModel:
            fakes.events.append(("get_peft_model", config))
            return FakePeftModel(fakes, model, "trained in memory")

        peft = module("peft", PeftModel=SimpleNamespace(from_pretrained=peft_from_pretrained),
                      LoraConfig=lambda **kwargs: SimpleNamespace(**kwargs), get_peft_model=get_peft_model)

        def load_dataset(loader: str, data_files: list[str] | None = None, split: str | None = None,
                         cache_dir: str | None = None, token: str | None = None,
                         streaming: bool = False) -> FakeDataset:
            fakes.events.append(("load_dataset", loader, split, token))
            if loader in fakes.hub:
                return FakeDataset(fakes.hub[loader])
            assert loader == "json", "these tests feed JSON lines or a hub dataset"
            lines = [line for f in data_files or [] for line in Path(f).read_text().splitlines() if line.strip()]
            return FakeDataset([json.loads(line) for line in lines])

        def load_from_disk(path: str) -> FakeDataset:
            fakes.events.append(("load_from_disk", path))
            return FakeDataset(json.loads((Path(path) / "records.json").read_text()))

        def partial_state(backend: str | None = None) -> None:
            fakes.events.append(("PartialState", backend, os.environ.get("ACCELERATE_USE_DEEPSPEED")))

        return {"torch": torch, "torch.distributed": dist, "transformers": transformers,
                "transformers.integrations": integrations, "transformers.integrations.deepspeed": hf_deepspeed,
                "peft": peft, "datasets": module("datasets", load_dataset=load_dataset, load_from_disk=load_from_disk,
                                                 Dataset=FakeDataset, Features=dict, List=lambda value: [value],
                                                 Value=str, __version__=str(RECIPE_VERSIONS["datasets"])),
                "accelerate": module("accelerate", PartialState=partial_state)}


def module(name: str, **attributes: Any) -> ModuleType:
    made = ModuleType(name)
    for attribute, value in attributes.items():
        setattr(made, attribute, value)
    return made


def install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, size: int = 1, *,
            initialized: bool = True, transformers: str = RECIPE_TRANSFORMERS) -> Fakes:
    fakes = Fakes(World(size, initialized=initialized), Disk(tmp_path, tmp_path / "model"))
    fakes.transformers_version = transformers
    for name, module in fakes.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    return fakes


# --- the stop agreement ---------------------------------------------------------------------------------------

def run_steps(ft: ModuleType, fakes: Fakes, steps: int, sigterm: dict[int, int]) -> list[tuple[int | None, list]]:
    """Each rank's callback after `steps` steps; rank r gets SIGTERM in step sigterm[r]. Per rank: the step it
    stopped at and the steps after which it was told to save and stop."""

    def rank_main(rank: int) -> tuple[int | None, list[int]]:
        stop = ft.StopRequest()
        callback = fr.stop_callback(stop)
        state, told = SimpleNamespace(global_step=0), []
        for step in range(1, steps + 1):
            state.global_step = step
            if sigterm.get(rank) == step:
                stop(signal.SIGTERM, None)
            control = SimpleNamespace(should_save=False, should_training_stop=False)
            control = callback.on_step_end(SimpleNamespace(device="cpu"), state, control)
            if control.should_save and control.should_training_stop:
                told.append(step)
                break
        return callback.stopped_at, told

    return fakes.world.run(rank_main)


def test_one_ranks_sigterm_stops_every_rank_at_the_same_step(ft: ModuleType, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Kubernetes signals one pod's ranks; the others learn of it through the all-reduce, or they would wait in
    # the next collective while rank 2 saves and leaves.
    fakes = install(monkeypatch, tmp_path, size=3)
    assert run_steps(ft, fakes, steps=6, sigterm={2: 3}) == [(3, [3]), (3, [3]), (3, [3])]
    # One all-reduce per step on every rank, also in the steps without a signal.
    assert sorted(fakes.world.calls) == sorted((rank, "all_reduce") for rank in range(3) for _ in range(3))


def test_no_signal_no_stop_and_every_signal_one_stop(ft: ModuleType, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=2)
    assert run_steps(ft, fakes, steps=4, sigterm={}) == [(None, []), (None, [])]
    fakes = install(monkeypatch, tmp_path, size=2)
    assert run_steps(ft, fakes, steps=4, sigterm={0: 2, 1: 2}) == [(2, [2]), (2, [2])]


def test_without_a_process_group_the_local_signal_decides(ft: ModuleType, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=1, initialized=False)
    assert run_steps(ft, fakes, steps=5, sigterm={0: 4}) == [(4, [4])]
    assert fakes.world.calls == []


# --- the export -------------------------------------------------------------------------------------------------

def export_args(ft: ModuleType, tmp_path: Path, *extra: str) -> Any:
    return ft.parse_args(["--model", "org/base", "--dataset", "org/data", "--checkpoint-dir",
                          str(tmp_path / "checkpoints"), "--model-dir", str(tmp_path / "model"), *extra], {})


def export_on_every_rank(ft: ModuleType, fakes: Fakes, args: Any, model: Any, precision: str = "bf16") -> list:
    """_export on each rank, as main calls it after training; per rank whether the marker was in MODEL_DIR when
    its export returned."""

    def rank_main(rank: int) -> bool:
        trainer = FakeTrainer(fakes, model=model, args=SimpleNamespace(world_size=fakes.world.size))
        trainer.state.global_step = 40
        fe.export(trainer, args, FakeTokenizer(fakes), "hf_token", precision, 40)
        return (Path(args.model_dir) / MARKER).is_file()

    return fakes.world.run(rank_main)


def stale_model(tmp_path: Path) -> None:
    """An older run's model in MODEL_DIR, with its marker."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / MARKER).write_text(STALE_MARKER)


def test_a_full_model_is_exported_with_its_tokenizer_then_the_marker_last(ft: ModuleType, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=2)
    stale_model(tmp_path)
    returned_after_marker = export_on_every_rank(ft, fakes, export_args(ft, tmp_path),
                                                 FakeModel(fakes, "trained org/base"))
    # A server waits for the marker, then loads: the weights and the tokenizer must all be there before it.
    assert fakes.disk.order() == ["model/model.safetensors", "model/config.json", "model/tokenizer.json",
                                  "model/tokenizer_config.json", "model/.complete"]
    # The older model's marker went before the first file of this one was written.
    assert [name for name, marker_there in fakes.disk.log if marker_there] == ["model/.complete"]
    assert json.loads((tmp_path / "model" / MARKER).read_text())["step"] == 40
    assert (tmp_path / "model" / "model.safetensors").read_text() == "trained org/base"
    # Every rank took part in the save (ZeRO-3's gather) and returned only once rank 0 had written the marker.
    assert sorted(name for rank, name in fakes.world.calls if rank == 1) == ["save_model", "wait_for_everyone",
                                                                             "wait_for_everyone"]
    assert returned_after_marker == [True, True]
    assert "merge_and_unload" not in fakes.event_names()


def test_a_lora_adapter_is_merged_into_the_base_model_at_export(ft: ModuleType, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=2)
    args = export_args(ft, tmp_path, "--lora", "--lora-export", "merged")
    adapter = tmp_path / "checkpoints" / "adapter-export"
    trained = FakePeftModel(fakes, FakeModel(fakes, "base org/base"), "trained")
    assert export_on_every_rank(ft, fakes, args, trained) == [True, True]
    # vLLM serves MODEL_DIR as a whole model: the merged weights, no adapter files.
    assert fakes.disk.order() == [
        "checkpoints/adapter-export/adapter_model.safetensors", "checkpoints/adapter-export/adapter_config.json",
        "model/model.safetensors", "model/config.json", "model/tokenizer.json", "model/tokenizer_config.json",
        "model/.complete"]
    assert (tmp_path / "model" / "model.safetensors").read_text() == (
        f"base org/base merged with adapter {adapter}")
    assert not adapter.exists()  # the adapter's temporary copy is gone
    merge = [e for e in fakes.events if e[0] in ("unset_hf_deepspeed_config", "AutoModelForCausalLM.from_pretrained",
                                                  "PeftModel.from_pretrained", "merge_and_unload", "save_pretrained")]
    assert merge == [
        ("save_pretrained", "adapter trained", str(adapter), True),
        # outside ZeRO-3's partitioning: the base model whole, in the training's precision, with the token
        ("unset_hf_deepspeed_config",),
        ("AutoModelForCausalLM.from_pretrained", "org/base", "torch.bfloat16", "hf_token"),
        ("PeftModel.from_pretrained", "base org/base", str(adapter), True),
        ("merge_and_unload", str(adapter)),
        ("save_pretrained", f"base org/base merged with adapter {adapter}", str(tmp_path / "model"), True)]
    marker = json.loads((tmp_path / "model" / MARKER).read_text())
    assert (marker["lora"], marker["export"]) == (True, "merged")
    assert "lora_rank" not in marker


def test_a_lora_adapter_is_exported_alone_by_default(ft: ModuleType, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=2)
    # An older merged export in MODEL_DIR: its weights must not stay beside the new adapter.
    stale_model(tmp_path)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (tmp_path / "model" / name).write_text("old")
    args = export_args(ft, tmp_path, "--lora", "--lora-rank", "8")
    trained = FakePeftModel(fakes, FakeModel(fakes, "base org/base"), "trained")
    assert export_on_every_rank(ft, fakes, args, trained) == [True, True]
    # peft's adapter folder (what vLLM's --lora-modules loads), the tokenizer, then the marker; no merge.
    assert fakes.disk.order() == ["model/adapter_model.safetensors", "model/adapter_config.json",
                                  "model/tokenizer.json", "model/tokenizer_config.json", "model/.complete"]
    assert not [e for e in fakes.events if e[0] in ("merge_and_unload", "AutoModelForCausalLM.from_pretrained")]
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [
        ".complete", "adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    marker = json.loads((tmp_path / "model" / MARKER).read_text())
    assert (marker["export"], marker["lora_rank"], marker["model"], marker["step"]) == ("adapter", 8, "org/base", 40)


def test_a_merged_export_removes_an_older_adapter(ft: ModuleType, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=1)
    stale_model(tmp_path)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (tmp_path / "model" / name).write_text("old")
    export_on_every_rank(ft, fakes, export_args(ft, tmp_path), FakeModel(fakes, "trained org/base"))
    assert not (tmp_path / "model" / "adapter_config.json").exists()
    assert not (tmp_path / "model" / "adapter_model.safetensors").exists()
    assert json.loads((tmp_path / "model" / MARKER).read_text())["export"] == "full"


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_the_base_model_is_loaded_in_the_trainings_precision(ft: ModuleType, tmp_path: Path, precision: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path)
    fe.merge_adapter(export_args(ft, tmp_path, "--lora"), tmp_path / "adapter", None, precision)
    assert ("AutoModelForCausalLM.from_pretrained", "org/base", DTYPES[precision], None) in fakes.events


# --- main -------------------------------------------------------------------------------------------------------

DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
             "zero_optimization": {"stage": 3}}


def run_main(ft: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str,
             sigterm_at_step: int | None = None, transformers: str = RECIPE_TRANSFORMERS) -> tuple[int, Fakes]:
    """main() on one CPU rank under DeepSpeed (DS_ACCELERATOR=cpu, ZeRO-3, bf16), 4 steps of prompt/response
    records, SIGTERM in `sigterm_at_step`, under stand-ins of that `transformers` release."""
    fakes = install(monkeypatch, tmp_path, transformers=transformers)
    fakes.sigterm_at_step = sigterm_at_step

    def install_handler(signum: int, handler: Any) -> None:  # not the pytest worker's own handler
        fakes.handlers[signum] = handler
        fakes.events.append(("signal.signal", signum))

    monkeypatch.setattr(signal, "signal", install_handler)
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # main wraps both; put back afterwards
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the datasets cache folder main makes
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    data = tmp_path / "data.jsonl"
    if not data.exists():  # a second start finds the same file (rewritten, it would be new data)
        data.write_text("".join(json.dumps({"q": f"question {i}", "a": f"answer {i}"}) + "\n" for i in range(6)))
    (tmp_path / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    code = ft.main(["--model", "org/base", "--dataset", str(data), "--prompt-field", "q", "--response-field", "a",
                    "--max-steps", "4", "--save-steps", "100", "--deepspeed", str(tmp_path / "ds_config.json"),
                    "--checkpoint-dir", str(tmp_path / "checkpoints"), "--model-dir", str(tmp_path / "model"),
                    *extra])
    return code, fakes


def test_a_finished_run_exports_and_exits_0(ft: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, fakes = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    names = fakes.event_names()
    # DeepSpeed's CPU state before the Trainer's arguments; the arguments before the model (under ZeRO-3 they make
    # from_pretrained load it partitioned); the SIGTERM handler before the training.
    assert names.index("PartialState") < names.index("TrainingArguments")
    assert names.index("TrainingArguments") < names.index("AutoModelForCausalLM.from_pretrained")
    assert names.index("signal.signal") < names.index("train")
    assert fakes.events[names.index("PartialState")] == ("PartialState", "gloo", "true")
    assert fakes.events[names.index("signal.signal")] == ("signal.signal", signal.SIGTERM)
    assert fakes.events[names.index("train")] == ("train", None)
    assert ("AutoModelForCausalLM.from_pretrained", "org/base", "torch.bfloat16", None) in fakes.events
    (trainer,) = fakes.trainers
    assert trainer.state.global_step == 4 and len(trainer.batches) == 4
    # The prompt's labels are masked in what the collator hands the model.
    assert trainer.batches[0]["labels"].values[0][:10] == [-100] * 10
    assert fakes.disk.order() == ["model/model.safetensors", "model/config.json", "model/tokenizer.json",
                                  "model/tokenizer_config.json", "model/.complete"]
    assert json.loads((tmp_path / "model" / MARKER).read_text())["step"] == 4


def test_the_gaudi_images_older_transformers_gets_its_own_keywords(ft: ModuleType, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 4.45 (optimum-habana v1.15.0's): from_pretrained(torch_dtype=), Trainer(tokenizer=), the token
    count a bool; with the recipe's own keywords its from_pretrained raises TypeError and the run never starts."""
    code, fakes = run_main(ft, tmp_path, monkeypatch, transformers=OLD_TRANSFORMERS)
    assert code == 0
    assert ("AutoModelForCausalLM.from_pretrained", "org/base", "torch.bfloat16", None) in fakes.events
    (arguments,) = [event[1] for event in fakes.events if event[0] == "TrainingArguments"]
    assert arguments["include_num_input_tokens_seen"] is True
    assert json.loads((tmp_path / "model" / MARKER).read_text())["step"] == 4


def test_the_recipes_transformers_counts_the_tokens_that_are_not_padding(ft: ModuleType, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _, fakes = run_main(ft, tmp_path, monkeypatch)
    (arguments,) = [event[1] for event in fakes.events if event[0] == "TrainingArguments"]
    assert arguments["include_num_input_tokens_seen"] == "non_padding"


def test_sigterm_saves_a_checkpoint_and_exits_143_without_export(ft: ModuleType, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    code, fakes = run_main(ft, tmp_path, monkeypatch, sigterm_at_step=2)
    assert code == rc.EXIT_PREEMPTED == 143
    assert fakes.disk.order() == ["checkpoints/checkpoint-2/trainer_state.json"]
    assert not (tmp_path / "model" / MARKER).exists()


def test_a_restarted_run_resumes_from_its_newest_checkpoint(ft: ModuleType, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoints" / "checkpoint-3").mkdir()  # cut off while saving: no trainer_state.json
    code, fakes = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    assert ("train", str(tmp_path / "checkpoints" / "checkpoint-2")) in fakes.events
    assert len(fakes.trainers[0].batches) == 2  # steps 3 and 4


def test_a_run_resumed_at_its_last_step_exports_it_without_training(ft: ModuleType, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after its last checkpoint, or run again for another export: the Trainer would train step 5 of 4."""
    (tmp_path / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint-4" / "trainer_state.json").write_text("{}")
    code, fakes = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    assert fakes.trainers[0].batches == []
    assert not (tmp_path / "checkpoints" / "checkpoint-5").exists()
    assert json.loads((tmp_path / "model" / MARKER).read_text())["step"] == 4


def test_a_lora_run_trains_an_adapter_and_exports_the_merged_model(ft: ModuleType, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, fakes = run_main(ft, tmp_path, monkeypatch, "--lora", "--lora-rank", "8", "--gradient-checkpointing",
                           "--lora-export", "merged")
    assert code == 0
    (config,) = [e[1] for e in fakes.events if e[0] == "get_peft_model"]
    assert (config.r, config.target_modules, config.task_type) == (8, "all-linear", "CAUSAL_LM")
    assert "enable_input_require_grads" in fakes.event_names()
    assert [e[1] for e in fakes.events if e[0] == "use_cache while training"] == [False]
    adapter = tmp_path / "checkpoints" / "adapter-export"
    assert (tmp_path / "model" / "model.safetensors").read_text() == f"base org/base merged with adapter {adapter}"
    assert not (tmp_path / "model" / "adapter_config.json").exists()


def test_a_hub_dataset_is_read_with_the_token(ft: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path)
    fakes.hub["org/data"] = [{"body": "hello"}, {"body": " "}]
    args = export_args(ft, tmp_path, "--text-field", "body", "--seq-len", "8")
    tokenizer = FakeTokenizer(fakes)
    run = fa.resolve(args)  # the arguments resolved once: data preparation reads the run
    head = fp.read_head(run, tokenizer, "hf_token", ft.StackKeys())
    data, held_out = fp.tokenized_datasets(run, tokenizer, "hf_token", ft.StackKeys(), head)
    assert ("load_dataset", "org/data", "train", "hf_token") in fakes.events
    # "hello": BOS, 5 tokens, EOS; the blank record (a blank line of a text file) is left out.
    assert [record["input_ids"] for record in data] == [[1, 7, 4, 11, 11, 14, 2]] == [head.first.input_ids]
    assert held_out is None and "length" not in data.column_names


def test_records_without_the_fields_stop_main_with_exit_2(ft: ModuleType, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, fakes = run_main(ft, tmp_path, monkeypatch, "--prompt-field", "question")
    assert code == ft.EXIT_USAGE
    out = capsys.readouterr().out
    assert "FAILED: --prompt-field: record 1 has no field 'question' (the prompt; it has a, q)" in out
    assert "train" not in fakes.event_names()


def test_the_stacks_key_is_named_in_a_data_error(ft: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """FINETUNE_STACK_KEYS (the stack sets it): the error names the key a person changes, not the flag."""
    monkeypatch.setenv("FINETUNE_STACK_KEYS", json.dumps({"--prompt-field": "workloads.tune.finetune.promptField"}))
    code, _ = run_main(ft, tmp_path, monkeypatch, "--prompt-field", "question")
    assert code == ft.EXIT_USAGE
    assert "FAILED: workloads.tune.finetune.promptField: record 1 has no field 'question'" in capsys.readouterr().out


def test_held_out_records_are_evaluated_at_every_save_and_at_the_end(ft: ModuleType, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    code, fakes = run_main(ft, tmp_path, monkeypatch, "--eval-split", "0.5")
    assert code == 0
    (training,) = [e[1] for e in fakes.events if e[0] == "TrainingArguments"]
    # The saves' steps (--save-steps 100), the loss only; the eval batch is ds_config.json's micro batch.
    assert {k: training[k] for k in ("eval_strategy", "eval_steps", "prediction_loss_only",
                                     "per_device_eval_batch_size")} == {
        "eval_strategy": "steps", "eval_steps": 100, "prediction_loss_only": True, "per_device_eval_batch_size": 2}
    (trainer,) = fakes.trainers
    assert len(trainer.train_dataset) == 3 and len(trainer.eval_dataset) == 3  # six records, half held out
    assert ("evaluate", 4, 3) in fakes.events  # step 4 is no save step: evaluated once more at the end
    assert fakes.event_names().index("evaluate") < fakes.event_names().index("save_pretrained")


def test_rank_0_writes_the_first_record_as_trained(ft: ModuleType, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    code, _ = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    sample = json.loads((tmp_path / "checkpoints" / "rendered-sample.json").read_text())
    # {"q": "question 0", "a": "answer 0"}: BOS and the question masked, the answer and EOS learned.
    question = [1, *(3 + ord(c) % 100 for c in "question 0")]
    answer = [*(3 + ord(c) % 100 for c in "answer 0"), 2]
    assert sample["input_ids"] == [*question, *answer]
    assert sample["labels"] == [-100] * len(question) + answer


def test_check_data_reads_the_first_records_and_stops_on_a_bad_one(ft: ModuleType, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--check-data (the launcher's step): the records read and rendered with the tokenizer, nothing trained; a
    malformed record exits 2 naming the key."""
    fakes = install(monkeypatch, tmp_path)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "yo"}]})
                    + "\n")
    monkeypatch.setenv("FINETUNE_STACK_KEYS", json.dumps({"--roles": "workloads.tune.finetune.roles"}))
    argv = ["--model", "org/base", "--dataset", str(data), "--checkpoint-dir", str(tmp_path / "c"),
            "--model-dir", str(tmp_path / "m"), "--check-data"]
    assert ft.main(argv) == ft.EXIT_USAGE
    out = capsys.readouterr().out
    assert "workloads.tune.finetune.roles: record 1, message 2 has the role 'bot'" in out
    assert ft.main([*argv, "--roles", "bot=assistant"]) == ft.EXIT_USAGE  # now: the model has no chat template
    assert "the model's tokenizer has no chat template" in capsys.readouterr().out
    data.write_text(json.dumps({"prompt": "hi", "completion": "yo"}) + "\n")
    assert ft.main(argv) == 0
    assert "[finetune] data check, --dataset: 1 records read: prompt-completion (prompt/completion); raw" in \
        capsys.readouterr().out
    assert [e[0] for e in fakes.events] == ["AutoTokenizer.from_pretrained"] * 3  # no Trainer, no model


def test_the_tokenized_data_is_made_once_and_reused_on_the_next_start(ft: ModuleType, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The first start tokenizes every record into CHECKPOINT_DIR/tokenized/<fingerprint>/ (marker last); the next
    start (a resume) memory-maps that folder and reads no record; another --seq-len is another folder."""
    code, fakes = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    out = capsys.readouterr().out
    (folder,) = (tmp_path / "checkpoints" / "tokenized").iterdir()
    assert "[finetune] tokenized 6 records in " in out and str(folder) in out
    assert json.loads((folder / "tokenized.json").read_text())["samples"] == 6
    code, fakes = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    out = capsys.readouterr().out
    assert f"[finetune] tokenized data reused from {folder} (6 samples" in out and "tokenized 6 records" not in out
    assert "load_dataset" not in fakes.event_names()  # no record read again
    assert ("load_from_disk", str(folder / "train")) in fakes.events
    code, _ = run_main(ft, tmp_path, monkeypatch, "--seq-len", "512")
    assert code == 0 and len(list((tmp_path / "checkpoints" / "tokenized").iterdir())) == 2


def test_rank_0_tokenizes_while_the_others_wait_then_all_read_its_folder(ft: ModuleType, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fakes = install(monkeypatch, tmp_path, size=2)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(3)))
    args = ft.parse_args(["--model", "org/base", "--dataset", str(data), "--checkpoint-dir", str(tmp_path / "c"),
                          "--model-dir", str(tmp_path / "m"), "--seq-len", "8"], {})

    run = fa.resolve(args)

    def rank_main(rank: int) -> list[list[int]]:
        tokenizer = FakeTokenizer(fakes)
        head = fp.read_head(run, tokenizer, None, ft.StackKeys())
        training = fakes.modules()["transformers"].TrainingArguments()
        with training.main_process_first(local=False):
            train, _ = fp.tokenized_datasets(run, tokenizer, None, ft.StackKeys(), head)
        return [record["input_ids"] for record in train]

    blocks, same = fakes.world.run(rank_main)
    assert blocks == same
    assert [e for e in fakes.event_names() if e == "load_dataset"] == ["load_dataset"]  # one rank read the records
    # "document 0".."document 2": BOS, 10 characters, EOS each; 36 tokens in 8-token blocks, the last 4 long.
    assert [len(b) for b in blocks] == [8, 8, 8, 8, 4]


def test_the_model_trains_without_its_kv_cache_and_is_exported_with_it(ft: ModuleType, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With the cache on, transformers' masks never look for the records of a padding-free batch (they would attend
    to each other); the exported config has the model's own setting back, for generate()."""
    code, fakes = run_main(ft, tmp_path, monkeypatch)
    assert code == 0
    assert [e[1] for e in fakes.events if e[0] == "use_cache while training"] == [False]
    assert json.loads((tmp_path / "model" / "config.json").read_text()) == {"use_cache": True}


def test_padding_free_batches_are_refused_on_transformers_without_packed_masks(
        ft: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The Gaudi image's 4.45: its masks let each record of a padding-free row attend to the ones before it (measured
    with tests/recipe in a 4.45.2 venv: logits off by 0.40): refused before anything trains, naming the flag."""
    code, fakes = run_main(ft, tmp_path, monkeypatch, "--packing", "on", transformers=OLD_TRANSFORMERS)
    assert code == ft.EXIT_USAGE
    assert "train" not in fakes.event_names()
    assert "--packing: padding-free batches need transformers 4.54 or later" in capsys.readouterr().out


def test_the_lr_scheduler_is_the_trainers_when_given(ft: ModuleType, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--lr-scheduler cosine reaches TrainingArguments as lr_scheduler_type; without it the Trainer keeps its own."""
    for name in ("cosine", "default"):
        (tmp_path / name).mkdir()
    _, fakes = run_main(ft, tmp_path / "cosine", monkeypatch, "--lr-scheduler", "cosine")
    (arguments,) = [event[1] for event in fakes.events if event[0] == "TrainingArguments"]
    assert arguments["lr_scheduler_type"] == "cosine"
    _, fakes = run_main(ft, tmp_path / "default", monkeypatch)
    (arguments,) = [event[1] for event in fakes.events if event[0] == "TrainingArguments"]
    assert "lr_scheduler_type" not in arguments

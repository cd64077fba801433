"""Step-time benchmark at real shapes: one model of Qwen2.5-1.5B's shapes, one trainer, strategies swapped.

A randomly initialised Qwen2 with Qwen2.5-1.5B's shapes (28 layers, hidden 1536, MLP 8960, 12
heads / 2 KV heads, vocabulary 151,936, tied embeddings; built locally from a config, nothing downloaded) and a
word-level tokenizer whose vocabulary covers every id (``t0 ... t151933`` plus pad and EOS), trained by ONE
``SharpGRPOTrainer`` (AdamW at this size holds about 18 GB, so there is one copy of the model). The variants are
swapped on that trainer between calls:

* ``trl`` and ``trl#2`` (the A/A control): plain TRL, i.e. ``GRPOTrainer._generate_and_score_completions`` and
  ``GRPOTrainer._compute_loss`` called on the same instance with no strategy configured;
* ``equal``, ``grpo_sg``, ``cw_grpo``, ``thr``, ``passk_mixed`` (``--strategies``): our overrides with that one
  strategy.

Prompts are ``--prompt_length`` random tokens; completions have exactly ``--max_completion_length`` tokens
(``min_new_tokens``); the reward is binary (a hash of the completion text, so about half of the completions score 1
and most groups are mixed). Timed, in an interleaved schedule (round r runs every variant once, the order rotated by
r, after ``--warmup`` discarded rounds):

* ``gen``: one ``_generate_and_score_completions`` of ``--batch_size`` completions in groups of G (generation,
  rewards, advantages and the advantage strategies), the same prompts and seed for every variant of a round, so all
  variants generate the very same completions;
* ``loss``: forward + backward of the loss on every micro-batch (``--micro_batch``) of one fixed generation batch
  (each variant's own output of one seeded ``gen`` call), gradients cleared, no optimizer step;
* ``step`` (``--steps`` rounds): gen + loss forward/backward over the micro-batches + gradient clipping + AdamW
  step, i.e. a whole optimizer step (the weights change, identically placed in every round).

Also reported per variant: the peak memory of each phase (CUDA ``max_memory_allocated``) and its ratio to TRL's,
and the host synchronisations of one micro-batch's loss forward + backward and of one ``gen`` call: on CUDA every
synchronising CUDA operation (``torch.cuda.set_sync_debug_mode("warn")``); on CPU, where nothing synchronises, the
Python-level reads of tensor values (``.item()``, ``.tolist()``, ``bool()``, ``float()``, ``int()``), which are
synchronisations on a GPU.

Paired ratios with 95% bootstrap intervals as in ``step_bench.py`` (same statistics code). On an H100 one
``model.generate`` call of this batch takes 7.5-8.5 s (launch-bound decoding), so the defaults take about 10 minutes;
``--gen_rounds 3 --steps 1`` took 478 s (benchmarks/RESULTS.md). The model is built on the GPU in seconds:

    python benchmarks/step_bench_real.py --device cuda --gen_rounds 3 --steps 1 --json step_real.json

A CPU smoke run at small shapes (same code path, minutes):

    OMP_NUM_THREADS=1 python benchmarks/step_bench_real.py --small
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
import warnings
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_bench  # noqa: E402  (sets the malloc options before torch starts threads)
import torch  # noqa: E402
from step_bench import CONTROL, PLAIN, clocks, load_average, print_table, rotated, summarise  # noqa: E402

QWEN25_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936)
SMALL = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=4096)
STRATEGIES = ["equal", "grpo_sg", "cw_grpo", "thr", "passk_mixed"]
TARGETS = {"equal": 1.01, "grpo_sg": 1.01, "cw_grpo": 1.02, "thr": 1.05, "passk_mixed": 1.01, "ar": 1.02}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run (same code path)")
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                        help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--batch_size", type=int, default=16, help="completions per generation batch")
    parser.add_argument("--micro_batch", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--num_generations", type=int, default=8)
    parser.add_argument("--prompt_length", type=int, default=64)
    parser.add_argument("--max_completion_length", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--gen_rounds", type=int, default=4)
    parser.add_argument("--loss_rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1,
                        help="timed full optimizer steps per variant (after one untimed round)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads on CPU (0: torch's default)")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.small:
        args.prompt_length, args.max_completion_length = min(args.prompt_length, 16), min(args.max_completion_length,
                                                                                         32)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.batch_size % args.num_generations or args.batch_size % args.micro_batch:
        raise SystemExit("--batch_size must be a multiple of --num_generations and of --micro_batch")
    return args


# ----------------------------------------------------------------------------------------------------------------
# Model, tokenizer, data
# ----------------------------------------------------------------------------------------------------------------
def build_tokenizer(vocab_size: int):
    """Word-level tokenizer over ``t0 ... t{V-3}`` plus ``<pad>`` (V-2) and ``<eos>`` (V-1): every id decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size - 2)}
    vocab["<pad>"], vocab["<eos>"] = vocab_size - 2, vocab_size - 1
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")


def build_model(shape: dict, tokenizer, device: str, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape, tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1e6,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, dtype=dtype)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def hashed_binary_reward(completions, **kwargs):
    return [float(zlib.crc32(text.encode()) % 2) for text in completions]


def prompt_dataset(num_prompts: int, length: int, vocab_size: int, seed: int):
    from datasets import Dataset

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size - 2, (num_prompts, length), generator=generator)
    return Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in ids.tolist()]})


def build_trainer(args, model, tokenizer, output_dir: str):
    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer

    config = SharpGRPOConfig(
        output_dir=output_dir, report_to=[], use_cpu=args.device == "cpu", bf16=args.dtype == "bfloat16",
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=args.batch_size // args.micro_batch,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        generation_kwargs={"min_new_tokens": args.max_completion_length}, temperature=1.0, loss_type="dapo",
        beta=0.0, learning_rate=1e-6, max_steps=10**6, save_strategy="no", disable_tqdm=True, seed=args.seed,
        strategies=["equal"],
    )
    trainer = SharpGRPOTrainer(model=model, reward_funcs=[hashed_binary_reward], args=config,
                               train_dataset=prompt_dataset(256, args.prompt_length, model.config.vocab_size,
                                                            args.seed),
                               processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    return trainer


# ----------------------------------------------------------------------------------------------------------------
# Variants on one trainer
# ----------------------------------------------------------------------------------------------------------------
def use_variant(trainer, name: str):
    """Configure ``trainer`` as variant ``name``; return (generate, loss) callables."""
    from trl import GRPOTrainer

    from sharpgrpo.strategies import STRATEGIES as REGISTRY

    if name in (PLAIN, CONTROL):
        trainer.weight_strategy, trainer.advantage_strategies = None, []
        return (lambda rows: GRPOTrainer._generate_and_score_completions(trainer, rows),
                lambda batch: GRPOTrainer._compute_loss(trainer, trainer.model, batch))
    trainer.args.strategies = [name]
    strategy = REGISTRY.get(name)(trainer.args)
    trainer.weight_strategy = strategy if strategy.kind == "weight" else None
    trainer.advantage_strategies = [strategy] if strategy.kind == "advantage" else []
    return trainer._generate_and_score_completions, lambda batch: trainer._compute_loss(trainer.model, batch)


def generation_rows(trainer, args, round_index: int) -> list[dict]:
    groups = args.batch_size // args.num_generations
    dataset = trainer.train_dataset
    return [dict(dataset[(round_index * groups + g) % len(dataset)]) for g in range(groups)
            for _ in range(args.num_generations)]


def synchronize(device):
    if device == "cuda":
        torch.cuda.synchronize()


class SyncCounter:
    """Counts host synchronisations inside the block (see the module docstring)."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, device: str):
        self.device, self.count = device, 0

    @contextlib.contextmanager
    def __call__(self):
        if self.device == "cuda":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    yield
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            self.count += sum("synchroniz" in str(w.message) for w in caught)
            return
        originals = {m: getattr(torch.Tensor, m) for m in self.METHODS}

        def counted(method):
            def wrapper(tensor, *a, **k):
                self.count += 1
                return originals[method](tensor, *a, **k)
            return wrapper

        for method in self.METHODS:
            setattr(torch.Tensor, method, counted(method))
        try:
            yield
        finally:
            for method, original in originals.items():
                setattr(torch.Tensor, method, original)


def peak_reset(device):
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device):
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def main(argv=None):
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.device == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    import tempfile

    import transformers
    import trl
    from trl.trainer.utils import split_tensor_dict

    transformers.logging.set_verbosity_error()
    primary = 1 if args.device == "cpu" and torch.get_num_threads() == 1 else 0
    clock_name = "cpu" if primary else "wall"
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    shape = SMALL if args.small else QWEN25_15B
    started = time.perf_counter()
    tokenizer = build_tokenizer(shape["vocab_size"])
    model = build_model(shape, tokenizer, args.device, dtype)
    names = [PLAIN, CONTROL, *args.strategies]
    num_micro = args.batch_size // args.micro_batch
    with tempfile.TemporaryDirectory(prefix="step_bench_real_") as output_dir:
        trainer = build_trainer(args, model, tokenizer, output_dir)
        params = sum(p.numel() for p in trainer.model.parameters())
        device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu ({os.cpu_count()} cores)"
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; device "
              f"{device_name}, dtype {args.dtype}, primary clock {clock_name}, load average {load_average()}")
        print(f"model: Qwen2 {shape} ({params / 1e6:.1f}M params, {'small' if args.small else 'Qwen2.5-1.5B'} "
              f"shapes); batch {args.batch_size} completions x {args.max_completion_length} tokens (fixed), "
              f"prompts {args.prompt_length} tokens, G = {args.num_generations}, micro-batch {args.micro_batch}; "
              f"variants {', '.join(names)}", flush=True)

        def generate(name, round_index, counter=None, reset=True):
            gen_fn, _ = use_variant(trainer, name)
            rows = generation_rows(trainer, args, round_index)
            torch.manual_seed(args.seed + round_index)
            synchronize(args.device)
            if reset:
                peak_reset(args.device)
            start = clocks()
            with counter() if counter else contextlib.nullcontext():
                output = gen_fn(rows)
            synchronize(args.device)
            end = clocks()
            return output, (end[0] - start[0], end[1] - start[1]), peak_bytes(args.device)

        def loss_backward(name, batch, counter=None, reset=True):
            _, loss_fn = use_variant(trainer, name)
            trainer.model.zero_grad(set_to_none=True)
            synchronize(args.device)
            if reset:
                peak_reset(args.device)
            start = clocks()
            for index, micro in enumerate(split_tensor_dict(batch, num_micro)):
                with counter() if counter and index == 0 else contextlib.nullcontext():
                    loss_fn(micro).backward()
            synchronize(args.device)
            end = clocks()
            return (end[0] - start[0], end[1] - start[1]), peak_bytes(args.device)

        # fixed batches (and a check that every variant generates the same completions), host syncs
        fixed, syncs = {}, {}
        for name in names:
            gen_counter, loss_counter = SyncCounter(args.device), SyncCounter(args.device)
            fixed[name], _, _ = generate(name, 10**6, gen_counter)
            loss_backward(name, fixed[name], loss_counter)
            syncs[name] = {"gen": gen_counter.count, "loss_micro_batch": loss_counter.count}
        identical = all(torch.equal(fixed[n]["completion_ids"], fixed[PLAIN]["completion_ids"]) for n in names)
        rewards = torch.tensor(trainer._metrics["train"]["reward"][-1:])
        print(f"fixed batch {list(fixed[PLAIN]['completion_ids'].shape)}, identical completions across variants: "
              f"{identical}; mean reward {rewards.tolist()}", flush=True)

        times = {"gen": {n: [] for n in names}, "loss": {n: [] for n in names}, "step": {n: [] for n in names}}
        peaks = {phase: {n: 0 for n in names} for phase in times}
        for round_index in range(args.warmup + args.gen_rounds):
            gc.collect()
            for name in rotated(names, round_index):
                _, elapsed, peak = generate(name, round_index)
                if round_index >= args.warmup:
                    times["gen"][name].append(elapsed)
                    peaks["gen"][name] = max(peaks["gen"][name], peak or 0)
        print(f"gen done ({time.perf_counter() - started:.0f} s)", flush=True)
        for round_index in range(args.warmup + args.loss_rounds):
            gc.collect()
            for name in rotated(names, round_index):
                elapsed, peak = loss_backward(name, fixed[name])
                if round_index >= args.warmup:
                    times["loss"][name].append(elapsed)
                    peaks["loss"][name] = max(peaks["loss"][name], peak or 0)
        print(f"loss done ({time.perf_counter() - started:.0f} s)", flush=True)
        for phase in ("gen", "loss"):  # printed now too, in case the step rounds do not finish in the time at hand
            print_table(phase, summarise(times[phase], primary, args), clock_name)
        sys.stdout.flush()
        trainer.model.zero_grad(set_to_none=True)
        optimizer = trainer.create_optimizer()
        for round_index in range(args.steps + (1 if args.steps else 0)):
            for name in rotated(names, round_index):
                synchronize(args.device)
                peak_reset(args.device)
                start = clocks()
                output, _, _ = generate(name, 1000 + round_index, reset=False)
                loss_backward(name, output, reset=False)
                torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                synchronize(args.device)
                end = clocks()
                if round_index >= 1:
                    times["step"][name].append((end[0] - start[0], end[1] - start[1]))
                    peaks["step"][name] = max(peaks["step"][name], peak_bytes(args.device) or 0)
        for mode in trainer._metrics.values():
            mode.clear()

    tables = {}
    for phase in ("step", "gen", "loss"):
        if times[phase][PLAIN]:
            tables[phase] = summarise(times[phase], primary, args)
            print_table(phase, tables[phase], clock_name)
    print("\n| variant | targets (step ratio) | host syncs: gen call | host syncs: loss micro-batch | "
          "peak gen | peak loss | peak step | peak step / TRL |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        def gib(value):
            return f"{value / 2**30:.2f} GiB" if args.device == "cuda" else "n/a"
        ratio = (f"{peaks['step'][name] / peaks['step'][PLAIN]:.3f}"
                 if args.device == "cuda" and peaks["step"][PLAIN] else "n/a")
        print(f"| {name} | {TARGETS.get(name, 1.0)} | {syncs[name]['gen']} | {syncs[name]['loss_micro_batch']} | "
              f"{gib(peaks['gen'][name])} | {gib(peaks['loss'][name])} | {gib(peaks['step'][name])} | {ratio} |")
    print(f"\ntotal {time.perf_counter() - started:.0f} s; load average {load_average()}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "times": times,
                                         "peaks": peaks, "syncs": syncs, "tables": tables,
                                         "identical_completions": identical}, indent=1))


if __name__ == "__main__":
    step_bench.TARGET = 1.01
    main()

"""``opd`` and ``iw_opd`` in the trainer with a real teacher (docs/methods.md §16): the tiny model built from another
seed (same tokenizer, other weights) teaches the tiny model. The teacher's log-probabilities the strategy reads equal
an independent float64 forward of the teacher; two steps of pure distillation (a reward that never differs, so TRL's
advantage is 0) move the student's log-probabilities toward the teacher's on the tokens the teacher prefers; the
reference model and a LoRA run's frozen base serve as teachers; a teacher with another tokenizer, one that does not
load and a missing teacher are refused in one line before the first step."""

from __future__ import annotations

import copy
import math

import pytest

pytestmark = pytest.mark.slow  # a teacher model is built and several runs train (CI: -m slow)
import torch
from helpers import make_trainer, tiny_config

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.validation import ConfigError

PROMPTS = [demo_dataset(16)[i // 8] for i in range(16)]


def constant_reward(completions, **kwargs):
    """A reward that never differs within a group: TRL's advantage is 0, only the distillation term trains."""
    return [1.0] * len(completions)


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    """The tiny model from another seed: the same tokenizer, other weights (its preferences differ)."""
    from sharpgrpo.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("teacher") / "qwen2", seed=1))


def forward_logps(model, output, temperature):
    """log softmax(logits / T) of the completion tokens, from one whole forward (float64 for a loaded model)."""
    with torch.no_grad():
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        model = copy.deepcopy(model).double()
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits
        length = output["completion_ids"].size(1)
        logp = torch.log_softmax(logits[:, -length - 1 : -1] / temperature, dim=-1)
    # (a trainer's model runs its forward as TRL's fused-head patch bound it: in its own dtype)
    return logp.gather(-1, output["completion_ids"].unsqueeze(-1)).squeeze(-1).double()


def generation_batch(trainer, seed=1):
    seen = {}
    strategy = trainer.advantage_strategies[0]
    original = strategy.token_advantages
    strategy.token_advantages = lambda batch: seen.setdefault("batch", batch) and original(batch)
    torch.manual_seed(seed)
    output = trainer._generate_and_score_completions(PROMPTS)
    strategy.token_advantages = original
    return output, seen["batch"]


def test_opd_reads_the_teachers_log_probabilities(tiny_model_path, teacher_path, tmp_path):
    from transformers import AutoModelForCausalLM

    args = tiny_config(tmp_path, strategies=["opd"], teacher_model=teacher_path, temperature=0.8, opd_coef=0.5)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[constant_reward], train_dataset=16)
    output, batch = generation_batch(trainer)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path)
    expected = forward_logps(teacher, output, 0.8)
    mask = output["completion_mask"].bool()
    torch.testing.assert_close(batch.extras["teacher_logps"].double()[mask], expected[mask], atol=1e-5, rtol=1e-5)
    gap = (expected - batch.old_logps.double()).clamp(-10, 10)
    assert gap[mask].abs().mean() > 0.1  # the teacher differs
    torch.testing.assert_close(output["advantages"].double()[mask], 0.5 * gap[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["opd", pytest.param("iw_opd", marks=pytest.mark.slow)])
def test_distillation_moves_the_student_toward_the_teacher(tiny_model_path, teacher_path, tmp_path, strategy):
    """Two steps with only the distillation term: on the tokens of a fixed batch the teacher prefers (d > 0.5) the
    student's log-probability rises, where it prefers them less (d < -0.5) it falls."""
    from transformers import AutoModelForCausalLM

    args = tiny_config(tmp_path, strategies=[strategy], teacher_model=teacher_path, max_steps=2, learning_rate=3e-3)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[constant_reward], train_dataset=16)
    output, _ = generation_batch(trainer)
    teacher = forward_logps(AutoModelForCausalLM.from_pretrained(teacher_path), output, 1.0)
    before = forward_logps(trainer.model, output, 1.0)
    trainer.train()
    after = forward_logps(trainer.model, output, 1.0)
    mask = output["completion_mask"].bool()
    gap, moved = (teacher - before)[mask], (after - before)[mask]
    assert moved[gap > 0.5].mean() > 0 > moved[gap < -0.5].mean()
    assert (moved * gap).sum() > 0  # on the whole, in the direction of d (the first-order change of sum d^2 < 0)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        for key in (f"{strategy}/teacher_logp_mean", f"{strategy}/gap_abs_mean"):
            assert math.isfinite(entry[key])


def test_no_teacher_term_no_movement(tiny_model_path, tmp_path):
    """The control: the same run without a distillation strategy (TRL's advantage 0, beta 0) leaves the student."""
    args = tiny_config(tmp_path, strategies=["equal"], max_steps=1, learning_rate=3e-3)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[constant_reward], train_dataset=16)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert all(torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())


def test_reference_model_as_teacher_starts_with_no_gap(tiny_model_path, tmp_path):
    """teacher_model: ref is TRL's reference model (beta > 0): before any step it is the policy, so the gap is the
    rounding between the decoding steps and a forward."""
    args = tiny_config(tmp_path, strategies=["opd"], teacher_model="ref", beta=0.01)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[constant_reward], train_dataset=16)
    output, batch = generation_batch(trainer)
    mask = output["completion_mask"].bool()
    assert (batch.extras["teacher_logps"] - batch.old_logps)[mask].abs().max() < 1e-4


def test_reference_teacher_reuses_trls_reference_log_probabilities(tiny_model_path, tmp_path):
    """With beta > 0 TRL already scored the batch with its reference model: teacher_model: ref takes those values
    (no second forward of the same model), which equal the teacher's own forward of the reference."""
    from sharpgrpo.training.generation import teacher as teacher_module

    args = tiny_config(tmp_path, strategies=["opd"], teacher_model="ref", beta=0.01)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[constant_reward], train_dataset=16)
    calls = []
    real_logps = teacher_module.Teacher.logps
    teacher_module.Teacher.logps = lambda self, output: calls.append(1) or real_logps(self, output)
    try:
        output, batch = generation_batch(trainer)
    finally:
        teacher_module.Teacher.logps = real_logps
    assert calls == []  # the reference ran once per batch: TRL's forward
    mask = output["completion_mask"].bool()
    assert torch.equal(batch.extras["teacher_logps"][mask], output["ref_per_token_logps"][mask])
    forward = teacher_module.load_teacher("ref", trainer).logps(output)  # the teacher's own forward of the same model
    assert (forward - output["ref_per_token_logps"])[mask].abs().max() < 1e-5


@pytest.mark.slow
def test_lora_base_as_teacher(tiny_model_path, tmp_path):
    """teacher_model: base in a LoRA run: the adapter is disabled for the teacher's forward only. After a step the
    adapter has moved the student away from its base, so the gap is no longer zero; the adapter is on again after."""
    pytest.importorskip("peft")
    from peft import LoraConfig

    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer

    args = tiny_config(tmp_path, strategies=["opd"], teacher_model="base", max_steps=2, learning_rate=1e-2)
    trainer = SharpGRPOTrainer(model=tiny_model_path, reward_funcs=[constant_reward], args=args,
                               train_dataset=demo_dataset(16),
                               processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
                               peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    output, batch = generation_batch(trainer)
    mask = output["completion_mask"].bool()
    assert (batch.extras["teacher_logps"] - batch.old_logps)[mask].abs().max() < 1e-4  # B = 0 at the start
    trainer.train()
    output, batch = generation_batch(trainer, seed=2)
    assert (batch.extras["teacher_logps"] - batch.old_logps)[mask].abs().max() > 1e-3


def test_bad_teachers_are_refused_in_one_line(tiny_model_path, teacher_path, tmp_path):
    from transformers import AutoTokenizer

    with pytest.raises(ConfigError, match="needs teacher_model"):
        tiny_config(tmp_path, strategies=["opd"])
    with pytest.raises(ValueError, match=r"teacher_model='.*missing'.*no model or tokenizer loads") as error:
        make_trainer(tiny_model_path, tiny_config(tmp_path, strategies=["opd"],
                                                  teacher_model=str(tmp_path / "missing")), train_dataset=16)
    assert "\n" not in str(error.value)
    other = tmp_path / "other_tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(teacher_path)
    tokenizer.add_tokens(["<extra_teacher_token>"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ValueError, match=r"another tokenizer than the policy .*: 1 more|tokens against") as error:
        make_trainer(tiny_model_path, tiny_config(tmp_path, strategies=["opd"], teacher_model=str(other)),
                     train_dataset=16)
    assert str(other) in str(error.value) and tiny_model_path in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="teacher_model='base' needs a LoRA run"):
        make_trainer(tiny_model_path, tiny_config(tmp_path, strategies=["opd"], teacher_model="base"),
                     train_dataset=16)
    # A teacher that does not fit (here a 70B-parameter Qwen2 config with the policy's tokenizer, no weights on disk:
    # the check reads its size from the config, before any weight loads) is refused in one line, naming the need.
    from transformers import AutoConfig

    huge = tmp_path / "huge_teacher"
    AutoTokenizer.from_pretrained(teacher_path).save_pretrained(huge)
    config = AutoConfig.from_pretrained(teacher_path)
    config.update({"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
                   "num_key_value_heads": 8, "head_dim": 128, "layer_types": ["full_attention"] * 80})
    config.save_pretrained(huge)
    with pytest.raises(ValueError, match=r"does not fit: its weights alone need \d+\.\d GiB in torch.float32") as error:
        make_trainer(tiny_model_path, tiny_config(tmp_path, strategies=["opd"], teacher_model=str(huge)),
                     train_dataset=16)
    assert str(huge) in str(error.value) and "\n" not in str(error.value)


def reprompted_row(trainer, output, batch):
    """The first row with a self-teacher: (its index, the row as the self-teacher sees it: TRL's reprompt with the
    successful sibling's completion, then the row's completion), after checking which rows have one."""
    from sharpgrpo.training.generation.teacher import self_teacher_prompts, successful_siblings

    teacher = batch.extras["self_teacher_logps"]
    rows = torch.isfinite(teacher).all(dim=1)
    siblings = successful_siblings(batch.rewards, 8, 1.0, exclude_self=True)
    assert rows.tolist() == [j is not None for j in siblings]
    assert bool(rows.any()), "no group had a successful completion"
    tokenizer = trainer.processing_class
    i = int(rows.nonzero()[0])
    demo = output["completion_ids"][siblings[i]]
    prompt = self_teacher_prompts([PROMPTS[i]["prompt"]], [tokenizer.decode(demo[demo != tokenizer.pad_token_id],
                                                                               skip_special_tokens=True)], [None])[0]
    if isinstance(prompt, str):  # the demo task's prompts are plain text
        prompt_ids = torch.tensor(tokenizer(text=[prompt])["input_ids"])
    else:
        prompt_ids = torch.tensor([tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                                 return_dict=True)["input_ids"]])
    return i, {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids),
               "completion_ids": output["completion_ids"][i : i + 1],
               "completion_mask": output["completion_mask"][i : i + 1]}


def test_sdpo_self_teacher_in_the_trainer(tiny_model_path, tmp_path):
    """sdpo: the rows with a successful sibling get the policy's log-probabilities under the reprompt (a float64
    forward of the policy on TRL's reprompt agrees), the others none (NaN); the advantage is s_i d."""
    from helpers import binary_letters_reward

    args = tiny_config(tmp_path, strategies=["sdpo"], temperature=0.8)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    output, batch = generation_batch(trainer)
    teacher = batch.extras["self_teacher_logps"]
    rows = torch.isfinite(teacher).all(dim=1)
    i, one = reprompted_row(trainer, output, batch)
    expected = forward_logps(trainer.model, one, 0.8)[0]
    mask = output["completion_mask"][i].bool()
    torch.testing.assert_close(teacher[i].double()[mask], expected[mask], atol=1e-5, rtol=1e-5)
    gap = (teacher - batch.old_logps).nan_to_num(0.0) * output["completion_mask"]
    assert gap[rows].abs().max() > 1e-3  # the demonstration changes the policy's view of the completion
    torch.testing.assert_close(output["advantages"].double(), (gap * rows[:, None]).double(), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_sdpo_trains_with_finite_metrics(tiny_model_path, tmp_path):
    from helpers import binary_letters_reward

    args = tiny_config(tmp_path, strategies=["sdpo"], sdpo_weight=0.5, max_steps=2)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        for key in ("sdpo/teacher_logp_mean", "sdpo/gap_abs_mean", "sdpo/reprompt_fraction"):
            assert math.isfinite(entry[key])


@pytest.mark.slow
def test_sdpo_ema_self_teacher(tiny_model_path, tmp_path):
    """``sdpo_teacher: ema``: after two optimizer steps the self-teacher's log-probabilities are those of the policy's
    exponential moving average (a float64 forward of the averaged weights on TRL's reprompt agrees; the live
    policy's forward differs, so the test can tell), and ``sdpo`` carries the average in its checkpoint state."""
    from helpers import binary_letters_reward

    args = tiny_config(tmp_path, strategies=["sdpo"], sdpo_teacher="ema", teacher_ema_decay=0.5, learning_rate=1e-2,
                       max_steps=2, temperature=0.8)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    ema = trainer._ema_teacher
    assert trainer.advantage_strategies[0]._teacher_state is ema
    trainer.train()
    output, batch = generation_batch(trainer)
    i, one = reprompted_row(trainer, output, batch)
    mask = output["completion_mask"][i].bool()
    teacher = batch.extras["self_teacher_logps"][i].double()[mask]
    averaged, live = forward_logps(ema.model, one, 0.8)[0][mask], forward_logps(trainer.model, one, 0.8)[0][mask]
    torch.testing.assert_close(teacher, averaged, atol=1e-5, rtol=1e-5)
    assert (live - averaged).abs().max() > 1e-3
    state = trainer.strategy_state()["SelfDistillationStrategy"]
    assert set(state) == {"teacher_ema." + name for name, _, _ in ema.pairs}


def test_opd_and_sdpo_share_one_ema_teacher(tiny_model_path, tmp_path):
    """``teacher_model: ema`` with ``sdpo_teacher: ema``: one copy of the policy, one update callback, carried by the
    first of them in ``strategies``; ``sdpo_teacher: live`` makes no copy."""
    from sharpgrpo.training.generation.teacher import EmaTeacherCallback

    args = tiny_config(tmp_path / "both", strategies=["opd", "sdpo"], teacher_model="ema", sdpo_teacher="ema")
    trainer = make_trainer(tiny_model_path, args, train_dataset=16)
    opd, sdpo = trainer.advantage_strategies
    assert opd._teacher_state is trainer._ema_teacher and sdpo._teacher_state is None
    assert sum(isinstance(c, EmaTeacherCallback) for c in trainer.callback_handler.callbacks) == 1
    live = make_trainer(tiny_model_path, tiny_config(tmp_path / "live", strategies=["sdpo"]), train_dataset=16)
    assert getattr(live, "_ema_teacher", None) is None
    assert not any(isinstance(c, EmaTeacherCallback) for c in live.callback_handler.callbacks)

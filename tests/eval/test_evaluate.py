"""End to end on CPU with the tiny model: generation, files written, resume, LoRA adapters, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from reward_fns.kk import kk_correct
from sharpgrpo.cli.eval import main as eval_main
from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.evaluation import EvalConfig, evaluate, output_paths
from sharpgrpo.evaluation.generation import DecodingSettings, TransformersGenerator
from sharpgrpo.evaluation.models import load_model_and_tokenizer


def read_samples(path):
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    return load_model_and_tokenizer(tiny_model_path, device="cpu")


def test_batched_greedy_equals_one_prompt_at_a_time(tiny):
    model, tokenizer = tiny
    prompts = list(demo_dataset(6)["prompt"])
    prompts = [p if i % 2 else "unrelated prefix " + p for i, p in enumerate(prompts)]  # unequal lengths: padding
    settings = DecodingSettings(max_new_tokens=10)
    batched = TransformersGenerator(model, tokenizer, batch_size=6).generate(prompts, settings)
    single = TransformersGenerator(model, tokenizer, batch_size=1).generate(prompts, settings)
    assert [s[0]["text"] for s in batched] == [s[0]["text"] for s in single]
    assert any(s[0]["text"].strip() for s in batched)  # the warm-started model writes letters


def test_sampling_is_seeded_and_gives_n_samples(tiny):
    model, tokenizer = tiny
    generator = TransformersGenerator(model, tokenizer, batch_size=8)
    settings = DecodingSettings(max_new_tokens=8, greedy=False, n=4, temperature=1.0, top_p=1.0)
    prompts = list(demo_dataset(3)["prompt"])
    first, again, other = (generator.generate(prompts, settings, seed=s) for s in (1, 1, 2))
    assert [len(samples) for samples in first] == [4, 4, 4]
    assert first == again and first != other
    assert all(sample["num_tokens"] <= 8 for samples in first for sample in samples)


def test_kk_on_shared_files_writes_json_markdown_and_samples(tiny_model_path, shared_kk_dir, tmp_path):
    output = tmp_path / "kk.json"
    data = [str(shared_kk_dir / f"kk_test_regen_{n}ppl.jsonl") for n in (2, 3)]
    result = evaluate(
        model=tiny_model_path, task="kk", data=data, limit=2, max_new_tokens=8, output=str(output), progress=False
    )
    paths = output_paths(output)
    assert json.loads(paths["json"].read_text())["summary"] == result["summary"]
    summary = result["summary"]
    assert {n: m["problems"] for n, m in summary["by_people"].items()} == {"2": 2, "3": 2}
    header, records = read_samples(paths["samples"])
    assert header["settings"]["task"] == "kk" and len(records) == 4
    # The stored judgement is kk_correct of the stored completion against the stored gold.
    for record in records:
        assert record["correct"] == [kk_correct(record["completions"][0], record["reference"]["solution_text_format"])]
    accuracy = sum(r["correct"][0] for r in records) / 4
    assert summary["overall"] == {"accuracy": accuracy, "correct": round(accuracy * 4), "problems": 4}
    markdown = paths["markdown"].read_text()
    assert "| Model | 2 ppl | 3 ppl | Avg. | Overall |" in markdown
    assert f"| {tiny_model_path} |" in markdown


def test_kk_default_data_is_the_seeded_generator_and_resume_skips_finished(tiny_model_path, tmp_path):
    output = str(tmp_path / "kk.json")
    common = {"model": tiny_model_path, "task": "kk", "kk_people": [2, 4], "max_new_tokens": 4, "output": output}
    common["progress"] = False
    first = evaluate(**common, limit=1)
    assert first["num_resumed"] == 0 and first["num_problems"] == 2
    assert all(r["id"].startswith("generated-seed1234/") for r in read_samples(output_paths(output)["samples"])[1])
    samples = output_paths(output)["samples"]
    with open(samples, "a") as handle:  # an interruption in the middle of writing a record
        handle.write('{"id": "generated-seed1234/4ppl/1", "gro')
    second = evaluate(**common, limit=2)  # resumes: the two puzzles of the first run are not generated again
    assert second["num_resumed"] == 2 and second["num_problems"] == 4
    lines = samples.read_text().splitlines()
    assert len(lines) == 6 and lines[3].endswith('"gro')  # header, 2 records, the cut line, 2 new records
    records = [json.loads(line) for line in lines[1:3] + lines[4:]]
    assert len({r["id"] for r in records}) == 4
    with pytest.raises(ValueError, match="max_new_tokens"):
        evaluate(**{**common, "max_new_tokens": 5}, limit=2)
    third = evaluate(**{**common, "max_new_tokens": 5}, limit=1, overwrite=True)
    assert third["num_resumed"] == 0 and len(read_samples(output_paths(output)["samples"])[1]) == 2


def test_math_sampled_and_greedy_sets(tiny_model_path, shared_math_dir, tmp_path):
    result = evaluate(
        model=tiny_model_path, task="math", data=["amc", "math500"], limit=2, n_samples=4, max_new_tokens=8,
        temperature=1.0, output=str(tmp_path / "math.json"), progress=False,
    )  # fmt: skip
    datasets = result["summary"]["datasets"]
    assert datasets["amc"]["decoding"] == "sampled" and datasets["amc"]["samples"] == 4
    assert set(datasets["amc"]["pass@k"]) == {"1", "2", "4"}
    assert datasets["math500"] == {**datasets["math500"], "decoding": "greedy", "samples": 1, "problems": 2}
    _, records = read_samples(output_paths(tmp_path / "math.json")["samples"])
    assert sorted(len(r["completions"]) for r in records) == [1, 1, 4, 4]
    assert list(result["summary"]["paper_table"]) == ["MATH 500", "AMC avg@4", "Avg."]


def test_qa_local_file_grouped_by_data_source(tiny_model_path, tmp_path):
    rows = [
        {"question": "who wrote hamlet", "golden_answers": ["William Shakespeare"], "data_source": "nq"},
        {"question": "capital of france", "golden_answers": ["Paris"], "data_source": "nq"},
        {"question": "which band sang help", "golden_answers": ["The Beatles"], "data_source": "hotpotqa"},
    ]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = evaluate(
        model=tiny_model_path, task="qa", data=[str(data)], max_new_tokens=6, output=str(tmp_path / "qa.json"),
        progress=False,
    )  # fmt: skip
    assert {n: m["problems"] for n, m in result["summary"]["datasets"].items()} == {"nq": 2, "hotpotqa": 1}
    _, records = read_samples(output_paths(tmp_path / "qa.json")["samples"])
    assert {r["reference"]["golden_answers"][0] for r in records} == {"William Shakespeare", "Paris", "The Beatles"}


def test_lora_adapter_directory_loads_base_plus_adapter(tiny_model_path, tiny, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    _, tokenizer = tiny
    inputs = tokenizer(["letters: a b c\nword:"], return_tensors="pt")
    with torch.no_grad():
        expected = peft_model(**inputs).logits
        loaded, _ = load_model_and_tokenizer(str(tmp_path / "adapter"), device="cpu")
        merged, _ = load_model_and_tokenizer(str(tmp_path / "adapter"), device="cpu", merge=True)
        assert torch.allclose(loaded(**inputs).logits, expected, atol=1e-6)
        assert torch.allclose(merged(**inputs).logits, expected, atol=1e-4)
        assert not hasattr(merged, "peft_config")
        with peft_model.disable_adapter():
            assert not torch.allclose(peft_model(**inputs).logits, expected, atol=1e-3)  # the adapter matters
    result = evaluate(
        model=str(tmp_path / "adapter"), task="kk", kk_people=[2], limit=1, max_new_tokens=4,
        output=str(tmp_path / "kk.json"), progress=False,
    )  # fmt: skip
    assert result["num_problems"] == 1


def test_cli_writes_the_same_files(tiny_model_path, tmp_path, capsys):
    output = tmp_path / "cli" / "kk.json"
    argv = ["--model", tiny_model_path, "--task", "kk", "--kk_people", "3", "--limit", "1", "--max_new_tokens", "4"]
    result = eval_main(argv + ["--output", str(output), "--no_progress"])
    assert output.is_file() and output.with_suffix(".md").is_file()
    assert "| Model | 3 ppl | Avg. | Overall |" in capsys.readouterr().out
    assert result["settings"]["kk_people"] == [3]


def test_output_paths_keep_dotted_names(tmp_path):
    paths = output_paths(tmp_path / "qwen.v2.json")
    assert [p.name for p in paths.values()] == ["qwen.v2.json", "qwen.v2.md", "qwen.v2.samples.jsonl",
                                                "qwen.v2.run_record.json"]
    assert output_paths(tmp_path / "run")["json"].name == "run.json"


def test_config_validation():
    with pytest.raises(ValueError, match="Unknown task"):
        EvalConfig(model="m", task="chess", output="o.json")
    with pytest.raises(ValueError, match="needs --data"):
        evaluate(model="sharpgrpo-tiny", task="qa", output="o.json", max_new_tokens=4)


def test_cli_refuses_a_missing_model_path_with_one_line_before_writing(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SHARPGRPO_DEBUG": "0", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "sharpgrpo", "eval", "--model", "./no_model", "--task", "kk",
               "--output", "out/kk.json"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: --model='./no_model': no such directory ({tmp_path.resolve() / 'no_model'}), and it is not a Hugging "
        "Face Hub id (org/name). (full traceback: --debug or SHARPGRPO_DEBUG=1)"
    ], result.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []  # no samples file, no output folder

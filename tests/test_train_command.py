"""`textenv train`: TRL-style options (TrlParser, --config, ModelConfig / get_peft_config) and runs of both
front ends with checkpoints, the final model and a tracker."""

from __future__ import annotations

import json

import pytest

from textenv.cli import run_command
from textenv.ppo.checkpoint import is_complete_checkpoint
from textenv.training.command import build, parse

TINY = ["--model_name_or_path", "tiny", "--steps", "2", "--batch_size", "2", "--mini_batch_size", "1", "--max_new_tokens", "3", "--no_progress"]


def test_config_file_values_are_overridden_by_the_command_line(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model_name_or_path: tiny\nlearning_rate: 0.001\nmax_turns: 5\nbatch_size: 4\nmini_batch_size: 2\n")
    options = parse(["--config", str(config), "--learning-rate", "2e-5"])
    assert options.ppo.learning_rate == 2e-5 and options.ppo.batch_size == 4 and options.episode.max_turns == 5
    assert options.model.model_name_or_path == "tiny"


@pytest.mark.parametrize("flag", ["--max_turns", "--max-turns"])
def test_both_spellings(flag):
    assert parse([flag, "7"]).episode.max_turns == 7


def test_lora_flags_go_through_trl_get_peft_config():
    from trl import get_peft_config

    model = parse(["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]).model
    peft_config = get_peft_config(model)
    assert peft_config.r == 4 and peft_config.lora_alpha == 8 and set(peft_config.target_modules) == {"q_proj", "v_proj"}
    assert get_peft_config(parse([]).model) is None


def adapted_layers(model) -> set[int]:
    return {int(name.split(".layers.")[1].split(".")[0]) for name, _ in model.named_parameters() if "lora_" in name}


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_lora_layers_puts_trls_adapters_on_the_top_layers(algorithm):
    argv = [*TINY, "--use_peft", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj", "--algorithm", algorithm, "--num_generations", "2"]
    top_two, _ = build(parse([*argv, "--lora_layers", "2"]))
    everywhere, _ = build(parse(argv))
    layers = top_two.accelerator.unwrap_model(top_two.model)
    num_layers = (layers.pretrained_model if algorithm == "ppo" else layers).config.num_hidden_layers
    assert adapted_layers(top_two.model) == {num_layers - 2, num_layers - 1}
    assert adapted_layers(everywhere.model) == set(range(num_layers))  # 0, the default: every layer, as TRL


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lora_layers", "8"], "add --use_peft"),
        (["--use_peft", "--lora_layers", "-1"], "--lora_layers must be >= 0"),
    ],
)
def test_lora_layers_without_adapters_or_below_zero_is_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(argv)


def test_lora_layers_cannot_narrow_a_regex_target():
    with pytest.raises(ValueError, match="cannot narrow the regex"):
        build(parse([*TINY, "--use_peft", "--lora_target_modules", r".*\\.q_proj", "--lora_layers", "1"]))


def test_report_to_sets_the_tracker_and_its_folder(tmp_path):
    ppo_config = parse(["--report_to", "tensorboard", "--output_dir", str(tmp_path)]).ppo
    assert ppo_config.log_with == "tensorboard" and ppo_config.project_kwargs["logging_dir"] == str(tmp_path / "runs")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "chess"], "--task must be one of"),
        (["--task", "gym"], "needs --dataset"),
        (["--report_to", "mlflow"], "--report_to must be"),
        (["--loss_scale", "first"], "loss_scale must be one of"),
        (["--mixed_precision", "int8"], "--mixed_precision must be"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--algorithm", "reinforce"], "--algorithm must be one of"),
        (["--algorithm", "grpo", "--batch_size", "6", "--mini_batch_size", "2", "--num_generations", "4"], "must be a multiple of --num_generations"),
        (["--algorithm", "grpo", "--loss_type", "bnpo"], "loss_type must be one of"),
    ],
)
def test_bad_options_are_refused(argv, message):
    with pytest.raises(ValueError, match=message):
        parse(argv)


def test_calculator_run_saves_checkpoints_the_final_model_and_tensorboard_logs(tmp_path):
    result = run_command(["train", *TINY, "--output_dir", str(tmp_path), "--save_steps", "1", "--report_to", "tensorboard"])
    assert result["steps"] == 1 and len(result["reward_means"]) == 1
    assert is_complete_checkpoint(tmp_path / "checkpoint-1")
    assert any((tmp_path / "final").glob("*.safetensors"))
    tables = _tensorboard_texts(tmp_path / "runs", "episodes")
    assert len(tables) == 1 and tables[0].startswith("| query | response | reward |")
    assert tables[0].count("\n| ") == 2  # one row per episode of the batch
    assert result["logs"][0].batch.response_texts[0].replace("\n", "<br>").replace("|", "\\|") in tables[0]


def _tensorboard_texts(log_dir, tag):
    """The text summaries logged under `tag` in any tensorboard event file under `log_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    texts = []
    for folder in sorted({path.parent for path in log_dir.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(folder), size_guidance={"tensors": 0})
        accumulator.Reload()
        for name in accumulator.Tags()["tensors"]:
            if name.startswith(tag):
                texts += [event.tensor_proto.string_val[0].decode() for event in accumulator.Tensors(name)]
    return texts


def test_gym_run_writes_completions(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"query": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(3)) + "\n")
    result = run_command(["train", *TINY, "--task", "gym", "--dataset", str(rows), "--gym_env", "tool_env", "--output_dir", str(tmp_path / "out")])
    assert result["steps"] == 1
    lines = (tmp_path / "out" / "completions.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and json.loads(lines[0])["env"] == "tool_env"


def _stats(result):
    return [(log.reward_mean, log.kl, float(log.stats["ppo/loss/total"])) for log in result["logs"]]


@pytest.mark.parametrize("task", ["calculator", "gym"])
def test_resume_gives_the_same_next_batches_and_stats_as_an_uninterrupted_run(tmp_path, task):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"query": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(5)) + "\n")
    data = ["--task", "gym", "--dataset", str(rows), "--gym_env", "tool_env"] if task == "gym" else []
    argv = ["train", *TINY, "--steps", "6", "--temperature", "1.0", "--max_new_tokens", "6", *data]
    whole = run_command([*argv, "--output_dir", str(tmp_path / "whole"), "--save_steps", "1"])
    resumed = run_command([*argv, "--output_dir", str(tmp_path / "whole"), "--resume_from_checkpoint", str(tmp_path / "whole" / "checkpoint-1")])
    assert whole["steps"] == 3 and resumed["steps"] == 2
    assert [log.batch.response_texts for log in resumed["logs"]] == [log.batch.response_texts for log in whole["logs"][1:]]
    assert _stats(resumed) == _stats(whole)[1:]


def test_a_new_run_into_the_same_folder_sets_the_previous_run_aside(tmp_path):
    run_command(["train", *TINY, "--output_dir", str(tmp_path)])
    run_command(["train", *TINY, "--output_dir", str(tmp_path)])
    (previous,) = (tmp_path / "previous").iterdir()
    lines = lambda path: path.read_text().splitlines()  # noqa: E731
    assert len(lines(tmp_path / "steps.jsonl")) == 1 == len(lines(previous / "steps.jsonl"))  # one step each, not two in one file
    assert {json.loads(line)["run"] for line in lines(tmp_path / "steps.jsonl")} != {json.loads(line)["run"] for line in lines(previous / "steps.jsonl")}


def test_resume_latest_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint-N folder"):
        run_command(["train", *TINY, "--output_dir", str(tmp_path), "--resume_from_checkpoint", "latest"])


def test_push_to_hub_uploads_the_final_folder_with_a_model_card(tmp_path, monkeypatch):
    # The hub is not reachable here: record what would be sent instead.
    import huggingface_hub

    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        folder = kwargs["folder_path"]
        calls.append(("upload_folder", kwargs["repo_id"], sorted(path.name for path in __import__("pathlib").Path(folder).iterdir())))
        calls.append(("card", (tmp_path / "out" / "final" / "README.md").read_text()))
        return "https://huggingface.co/me/calc/commit/1"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    run_command(["train", *TINY, "--output_dir", str(tmp_path / "out"), "--push_to_hub", "--hub_model_id", "me/calc", "--hub_token", "secret-token"])
    assert calls[0] == ("create_repo", "me/calc", {"private": None, "exist_ok": True})
    name, repo_id, files = calls[1]
    assert name == "upload_folder" and repo_id == "me/calc"
    assert {"README.md", "tokenizer.json", "config.json"} <= set(files) and any(file.endswith(".safetensors") for file in files)
    card = calls[2][1]
    assert card.startswith("---\nlibrary_name: textenv") and "base_model: tiny" in card and "# me/calc" in card
    assert "secret-token" not in card and '"max_turns"' in card


def test_short_aliases_of_the_other_commands():
    model = parse(["--model", "tiny", "--lora", "--lora-rank", "8"]).model
    assert model.model_name_or_path == "tiny" and model.use_peft and model.lora_r == 8
    assert parse(["--model=bundled"]).model.model_name_or_path == "bundled"


def test_ppo_steps_means_what_it_means_in_the_demo():
    options = parse(["--ppo_steps", "5", "--batch_size", "4", "--mini_batch_size", "2"])
    assert options.ppo.steps == 20 and options.ppo.total_ppo_epochs == 5  # --steps keeps legacy PPOConfig's meaning: samples
    assert parse(["--steps", "20", "--batch_size", "4", "--mini_batch_size", "2"]).ppo.total_ppo_epochs == 5


def test_dataset_from_a_datasets_folder(tmp_path):
    import datasets

    from textenv.gym import load_rows

    rows = [{"query": "What is 1+1?", "answer": "2"}, {"query": "What is 2+2?", "answer": "4"}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "plain"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "split"))
    assert load_rows(str(tmp_path / "plain")) == rows == load_rows(str(tmp_path / "split"))
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        load_rows(str(tmp_path / "missing.jsonl"))


def test_an_fsdp_launch_that_runs_without_fsdp_is_reported(monkeypatch, caplog):
    # Measured with `accelerate launch --config_file examples/accelerate/fsdp.yaml` on this CPU-only machine:
    # both processes ran as MULTI_CPU with the model in DistributedDataParallel.
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from textenv.training.command import warn_if_fsdp_ignored

    multi_cpu, fsdp = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU), SimpleNamespace(distributed_type=DistributedType.FSDP)
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert not warn_if_fsdp_ignored(multi_cpu)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert not warn_if_fsdp_ignored(fsdp)
    with caplog.at_level("WARNING", logger="textenv"):
        assert warn_if_fsdp_ignored(multi_cpu)
    assert "runs as MULTI_CPU here" in caplog.text and "not sharded" in caplog.text


GRPO = ["--algorithm", "grpo", "--num_generations", "2", "--batch_size", "4", "--mini_batch_size", "2", "--steps", "8", "--temperature", "1.0"]


@pytest.mark.parametrize("task", ["calculator", "gym"])
def test_grpo_trains_both_front_ends_from_one_command(tmp_path, task):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"query": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(3)) + "\n")
    data = ["--task", "gym", "--dataset", str(rows), "--gym_env", "tool_env"] if task == "gym" else []
    result = run_command(["train", *TINY, *GRPO, *data, "--output_dir", str(tmp_path / "out"), "--save_steps", "1"])
    assert result["steps"] == 2
    for log in result["logs"]:
        assert {"grpo/advantages", "grpo/rewards/group_mean", "grpo/clip_ratio/region_mean", "objective/entropy"} <= set(log.stats)
        assert "ppo/loss/value" not in log.stats and log.kl != log.kl and log.kl_coef == 0.0  # no reference at beta 0
        texts = log.batch.query_texts
        assert texts[0] == texts[1] and texts[2] == texts[3]  # groups of num_generations episodes of one task
    assert is_complete_checkpoint(tmp_path / "out" / "checkpoint-2")
    steps = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert [line["kl"] for line in steps] == [None, None]  # JSON has no NaN: the page leaves the KL chart out
    resumed = run_command(["train", *TINY, *GRPO, *data, "--steps", "12", "--output_dir", str(tmp_path / "out"), "--resume_from_checkpoint", "latest"])
    assert resumed["steps"] == 1


def test_ppo_stays_the_default():
    options = parse(TINY)
    assert options.algorithm.algorithm == "ppo"
    trainer, _ = build(options)
    assert type(trainer).__name__ == "PPOTrainer" and hasattr(trainer.model, "v_head")


def test_model_card_says_which_algorithm_trained_the_policy(tmp_path):
    from textenv.training.hub import write_model_card

    grpo = write_model_card(tmp_path, "me/agent", {"algorithm": "GRPO", "steps": 3}).read_text()
    assert "GRPO on" in grpo and "GRPO steps: 3" in grpo and "no value head" in grpo and "WithValueHead" not in grpo
    ppo = write_model_card(tmp_path, "me/agent", {"steps": 3}).read_text()
    assert "PPO steps: 3" in ppo and "AutoModelForCausalLMWithValueHead" in ppo

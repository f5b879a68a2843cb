"""`cardjax generate` from an imported checkpoint with its tokenizer, and from a MARS run's
checkpoint (its block size is the default --block)."""

from cardjax import hf
from cardjax.cli import main
from cardjax.data.tokenizer import train_bpe
from cardjax.model import ModelConfig, create_model
from serve_helpers import save_mars_run


def _import_checkpoint(tmp_path):
  """A random tiny model with a trained BPE, imported from an HF folder (no run config)."""
  tok = train_bpe(["alpha beta gamma delta"] * 20, 300, tmp_path / "hf")
  model = create_model(ModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64,
                                   num_layers=1, mask_token_id=tok.mask_id, eos_token_id=0),
                       seed=0)
  hf.save_pretrained(model, tmp_path / "hf", assets_from=tmp_path / "hf")
  assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "ck"),
               "--mask-token-id", str(tok.mask_id)]) == 0


def test_generate_ar_and_mars(tmp_path, capsys):
  _import_checkpoint(tmp_path)
  capsys.readouterr()
  args = ["generate", "--checkpoint", str(tmp_path / "ck"), "--prompt", "alpha beta",
          "--max-new-tokens", "6"]
  assert main(args) == 0
  ar_out = capsys.readouterr().out
  assert "method ar" in ar_out and "tokens per forward" in ar_out
  assert main(args + ["--method", "mars", "--tau", "1.0"]) == 0
  mars_out, err = capsys.readouterr()
  assert "method mars B=4" in mars_out  # an import records no B: 4, and a line says so
  assert "records no MARS block size (no mars run config); using --block 4" in err
  # tau = 1 is AR greedy: the same text.
  assert ar_out.split("\n")[1] == mars_out.split("\n")[1]
  assert main(args + ["--method", "mars", "--verify"]) == 0
  assert capsys.readouterr().out.split("\n")[1] == ar_out.split("\n")[1]  # lossless
  assert main(args + ["--method", "card", "--block", "4", "--order", "dus"]) == 0
  assert "method card" in capsys.readouterr().out
  assert main(args + ["--method", "mars", "--objective", "mdlm"]) == 2
  assert "cannot serve --method mars; methods that fit: dus, eb, cb" in capsys.readouterr().err
  assert main(args + ["--method", "beam"]) == 2
  assert "unknown decoding method 'beam'" in capsys.readouterr().err
  assert main(args + ["--method", "mars", "--tau", "2"]) == 2
  assert "tau=2.0 must lie in [0, 1]" in capsys.readouterr().err
  assert main(args + ["--method", "mars", "--verify", "--temperature", "0.7"]) == 2
  assert "--verify decodes exactly AR greedy and cannot sample" in capsys.readouterr().err


def test_generate_batches_a_prompt_file_on_the_device_mesh(tmp_path, capsys):
  _import_checkpoint(tmp_path)
  (tmp_path / "prompts.txt").write_text("alpha\nbeta gamma\n\ndelta alpha beta\n")
  base = ["generate", "--checkpoint", str(tmp_path / "ck"), "--prompts",
          str(tmp_path / "prompts.txt"), "--max-new-tokens", "5", "--batch", "2"]
  capsys.readouterr()
  assert main(base) == 0
  ar_out = capsys.readouterr().out
  assert ar_out.count("--- ") == 3  # blank lines are skipped
  assert main(base + ["--method", "mars", "--tau", "1.0", "--cache-block", "8"]) == 0
  mars_out = capsys.readouterr().out
  assert mars_out.split("method")[0] == ar_out.split("method")[0]  # tau = 1 is AR greedy


def _mars_run_checkpoint(tmp_path, block_size: int):
  """A checkpoint as a MARS training run saves it (params, model config, run config with
  objective.block_size), written directly: no training needed to read its settings."""
  tok = train_bpe(["alpha beta gamma delta"] * 20, 300, tmp_path / "tok")
  model = create_model(ModelConfig(vocab_size=320, hidden_size=32, intermediate_size=64,
                                   num_layers=1, mask_token_id=tok.mask_id, eos_token_id=0),
                       seed=0)
  return save_mars_run(model, block_size, tmp_path / "run", tmp_path / "tok")


def test_mars_block_defaults_to_the_runs_block_size(tmp_path, capsys):
  run = _mars_run_checkpoint(tmp_path, block_size=8)
  args = ["generate", "--checkpoint", str(run), "--prompt", "alpha beta", "--max-new-tokens",
          "8", "--method", "mars", "--tau", "0"]
  capsys.readouterr()
  assert main(args) == 0
  default, err = capsys.readouterr()
  assert "method mars B=8 (step 0, objective mars)" in default and not err
  assert main(args + ["--block", "8"]) == 0
  assert capsys.readouterr().out.split("method")[0] == default.split("method")[0]
  assert main(args + ["--block", "4"]) == 0
  assert "method mars B=4" in capsys.readouterr().out
  # tau 0 accepts whole blocks: 8 tokens in one forward of B = 8 (unless a stop token came)
  tokens, forwards = (int(x) for x in
                      default.split("):")[1].split(" row-forwards")[0].split(" tokens, "))
  assert forwards == 1 or tokens < 8
  assert main(args + ["--method", "card"]) == 2  # a MARS run serves ar and mars only
  assert main(["generate", "--checkpoint", str(run), "--prompt", "alpha", "--method", "ar",
               "--max-new-tokens", "3"]) == 0
  assert "method ar (step 0" in capsys.readouterr().out

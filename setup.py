"""What the wheel holds beside pyproject.toml's metadata: cardjax's packages, the lm-eval
task files of `cardjax eval --harness`, and the recipes. configs/ stays the top-level folder
the repository shows; the wheel carries it as cardjax/recipes, so an installed `cardjax`
finds `--config tiny_ar` or `card_1b` outside a clone (cardjax.config.recipes_dir)."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["cardjax", "cardjax.*"]), "cardjax.recipes"],
    package_dir={"cardjax.recipes": "configs"},
    package_data={"cardjax.eval.harness": ["tasks/*.yaml", "tasks/*.jsonl"]},
)

"""gpt shapes that no bundled option gives from the command line, for the layout refusals of
tests/engine/test_pipeline_layouts.py: `--model tests.engine.layoutmodels:three_heads`."""

from fasttrain.models.gpt import GPT

VOCAB = 128  # ≥ any character id of the bundled text data


def three_heads() -> GPT:
    return GPT((32,), VOCAB, n_layer=4, n_head=3, n_embd=48)


def one_block() -> GPT:
    return GPT((32,), VOCAB, n_layer=1, n_head=2, n_embd=32)

"""Training tools for the shipped tiny checkpoints (``engines/models/*``); not installed.

Run from the repository root (``python -m training --help``):

    python -m training train [options]      # train a checkpoint (train.py)
    python -m training distill [options]    # self-distil a block-diffusion checkpoint (distill.py)

``tokenizer.py`` builds the character tokenizer and ``model.py`` a fresh Llama; the engines need
neither, since every shipped folder holds its ``tokenizer.json`` and loads through the Auto
classes. Training imports the engines and the suites; nothing installed imports training.
"""

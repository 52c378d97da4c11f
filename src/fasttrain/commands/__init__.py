"""The commands' side of the lab: each module adds one subcommand's parser (`<cmd>_parser(sub)`),
runs it (`<cmd>(args) -> int`) and renders its tables and plots. The models and measurements they
print live in `fasttrain.lab` and never import these modules, argparse or rich.
"""

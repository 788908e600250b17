"""What a model's forward takes from a fairseq sample: the encoder's inputs (side inputs only where the encoder
accepts them), the whole net_input, and a sample moved to a device. Used by umst-inspect, tests and benchmarks."""
import torch

from umst_plugin.data.side_inputs import HINT_KEYS, SIDE_INPUT_KEYS, encoder_accepts_side_inputs


def encoder_inputs(model, sample):
    """The encoder's kwargs from a sample, without side inputs the encoder does not take."""
    keep_side = encoder_accepts_side_inputs(model)
    return {k: v for k, v in sample["net_input"].items()
            if k != "prev_output_tokens" and (keep_side or k not in SIDE_INPUT_KEYS + HINT_KEYS)}


def model_inputs(model, sample):
    net_input = encoder_inputs(model, sample)
    net_input["prev_output_tokens"] = sample["net_input"]["prev_output_tokens"]
    return net_input


def move_sample(sample, device):
    def move(x):
        if torch.is_tensor(x):
            return x.to(device)
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x
    return move(sample)

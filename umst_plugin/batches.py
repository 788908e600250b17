"""What a model's forward takes from a fairseq sample: the encoder's inputs (side inputs only where the encoder
accepts them), the whole net_input, and a sample moved to a device. Used by umst-inspect, tests and benchmarks."""
import torch

from umst_plugin.data.side_inputs import keep_named_inputs


def encoder_inputs(model, sample):
    """The encoder's kwargs from a sample: the side inputs and hints it names, no other."""
    return {k: v for k, v in keep_named_inputs(sample["net_input"], [model]).items() if k != "prev_output_tokens"}


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

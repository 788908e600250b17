"""Patch: ``LanguagePairDataset`` takes tensor sizes without numpy's ``copy=False`` DeprecationWarning.

``LanguagePairDataset.__init__`` (fairseq/data/language_pair_dataset.py, lines 240-241 of fairseq-fixed
0.12.3.1) keeps ``np.array(src_sizes)`` and ``np.array(tgt_sizes)``. fairseq's own hub interface
(``GeneratorHubInterface._build_batches``: ``translate``, ``generate``, ``sample``) passes the lengths as a
``torch.LongTensor``, and so do the plugin's test and benchmark datasets; numpy 2 then asks the tensor's
``__array__`` for ``copy=False``, which torch's does not take, and warns twice per dataset (340 of the 1,570
warnings of the GPU check's CUDA test run, all from ``tests/test_model_checks.py``). The patch hands fairseq a numpy array of the same values (``tensor.numpy()``; a CPU copy
for a tensor on another device): ``np.array`` copies it as before, so the dataset's sizes are unchanged.
"""
import torch

from umst_plugin.patches import wrap

TARGET = "fairseq.data.language_pair_dataset.LanguagePairDataset.__init__"
SYMPTOM = ("a DeprecationWarning (numpy: '__array__ implementation doesn't accept a copy keyword, so passing "
           "copy=False failed') for every dataset built with tensor sizes: every from_pretrained(...).translate")
REMOVE_WHEN = "fairseq builds its size arrays with np.asarray / tensor.numpy(), or torch's __array__ takes copy"


def sizes_as_numpy(sizes):
    """``sizes`` as a numpy array where it is a tensor (same values and dtype), else unchanged."""
    if torch.is_tensor(sizes):
        return sizes.detach().cpu().numpy()
    return sizes


def install():
    from fairseq.data.language_pair_dataset import LanguagePairDataset

    def make(original):
        def __init__(self, src, src_sizes, src_dict, tgt=None, tgt_sizes=None, *args, **kwargs):
            original(self, src, sizes_as_numpy(src_sizes), src_dict, tgt, sizes_as_numpy(tgt_sizes), *args,
                     **kwargs)
        return __init__

    wrap(LanguagePairDataset, "__init__", make, __name__,
         "(self, src, src_sizes, src_dict, tgt=None, tgt_sizes=None, tgt_dict=None, left_pad_source=True, "
         "left_pad_target=False, shuffle=True, input_feeding=True, remove_eos_from_source=False, "
         "append_eos_to_target=False, align_dataset=None, constraints=None, append_bos=False, eos=None, "
         "num_buckets=0, src_lang_id=None, tgt_lang_id=None, pad_to_multiple=1)")

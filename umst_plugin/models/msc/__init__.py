"""MSC, Multiscale Collaborative deep models (Wei et al., ACL 2020): fairseq model ``msc`` (``model.py``), its
encoder (``encoder.py``) and decoder (``decoder.py``), options and arch defaults (``config.py``), what
``umst-inspect`` draws of it (``capture.py``); its layers are :mod:`umst_plugin.modules.msc.layer`. Importing the
package registers the model, its archs and the family."""
from umst_plugin import families
from umst_plugin.models.msc.capture import capture_msc
from umst_plugin.models.msc.encoder import MSCEncoder
from umst_plugin.models.msc.model import MSCModel
from umst_plugin.modules.msc.layer import MSCDecoderLayer, MSCEncoderLayer


families.register(families.Family(
    name="msc", title="MSC", paper="Wei et al., ACL 2020: Multiscale Collaborative Deep Models for NMT",
    model=MSCModel, encoder=MSCEncoder, layers=(MSCEncoderLayer, MSCDecoderLayer), capture=capture_msc,
    bench_rows={"msc": families.BenchRow("msc_base", "msc_big", quick=dict(encoder_blocks=2, encoder_layers_per_block=1),
                                         baseline="transformer_dropout")}))

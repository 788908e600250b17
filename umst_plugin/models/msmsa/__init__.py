"""MSMSA, Multi-Scale Self-Attention (Guo et al., AAAI 2020): fairseq model ``msmsa`` (``model.py``), its encoder
(``encoder.py``) and causal multi-scale decoder (``decoder.py``), options and arch defaults (``config.py``), what
``umst-inspect`` draws of it (``capture.py``); its layers are :mod:`umst_plugin.modules.msmsa.layer`. Importing the
package registers the model, its archs and the family."""
from umst_plugin import families
from umst_plugin.models.msmsa.capture import capture_msmsa
from umst_plugin.models.msmsa.encoder import MSMSAEncoder
from umst_plugin.models.msmsa.model import MSMSAModel
from umst_plugin.modules.msmsa.layer import MSMSADecoderLayer, MSMSAEncoderLayer


families.register(families.Family(
    name="msmsa", title="MSMSA", paper="Guo et al., AAAI 2020: Multi-Scale Self-Attention for Text Classification",
    model=MSMSAModel, encoder=MSMSAEncoder, layers=(MSMSAEncoderLayer, MSMSADecoderLayer),
    capture=capture_msmsa,
    bench_rows={"msmsa": families.BenchRow("msmsa_base", "msmsa_big")}))

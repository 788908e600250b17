"""UMST, the Universal MultiScale Transformer (Li et al., ICML 2022): fairseq model ``umst`` (``model.py``),
its encoder (``encoder.py``), options and arch defaults (``config.py``), what ``umst-inspect`` draws of it
(``capture.py``); its layer is :mod:`umst_plugin.modules.umst.layer`. Importing the package registers the model,
its archs and the family."""
from umst_plugin import families
from umst_plugin.models.umst.capture import capture_umst
from umst_plugin.models.umst.encoder import UMSTEncoder
from umst_plugin.models.umst.model import UMSTModel
from umst_plugin.modules.umst.layer import UMSTEncoderLayer


families.register(families.Family(
    name="umst", title="UMST", paper="Li et al., ICML 2022: Universal MultiScale Transformer",
    model=UMSTModel, encoder=UMSTEncoder, layers=(UMSTEncoderLayer,), capture=capture_umst,
    bench_rows={"umst": families.BenchRow("umst_base", "umst_big", baseline="transformer_dropout"),
                "umst_rpr": families.BenchRow("umst_base_rpr", "umst_big_rpr", baseline="transformer_dropout")}))

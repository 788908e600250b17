"""What ``--compile`` keeps while a process runs, in one object: :data:`STATE`.

Every module of the package reads and writes its part there, and nowhere else; a test that needs a clean slate
for one part replaces that attribute (``monkeypatch.setattr(STATE, "eager_variants", {})``).
"""
import dataclasses


@dataclasses.dataclass
class CompileState:
    # (device type, backend) -> seconds the start-up check took, for each that compiled (probe.check_available)
    probed: dict = dataclasses.field(default_factory=dict)
    # (a layer class's eager forward, compile options) -> its torch.compile wrapper, shared by the class's layers
    compiled_functions: dict = dataclasses.field(default_factory=dict)
    # a layer class's forward compiled with CUDA graphs -> its cap on the shapes recorded (graph_shapes.ShapeCap)
    graph_caps: dict = dataclasses.field(default_factory=dict)
    # (a tensor argument that was a view, its version, its plain copy): the copy reused (dispatch._plain)
    last_plain: tuple = (None, None, None)
    # inside dispatch.layers_eager(): compiled layers run their eager forward
    layers_eager: bool = False
    # (eager forward function, variant) -> why it runs eager (fallback.fall_back)
    eager_variants: dict = dataclasses.field(default_factory=dict)
    # the same keys -> the end of the failure's traceback (for a bug report, not the log)
    fallback_tracebacks: dict = dataclasses.field(default_factory=dict)
    # the compiled layer whose backward runs now, as retry.mark_backward's hook recorded it: (layer, its eager
    # forward, args, kwargs, modes at the call); None outside a compiled backward
    in_backward: tuple = None
    # (compile, tf32, device) of each fairseq CLI main running in this process, innermost last (flags)
    requests: list = dataclasses.field(default_factory=list)


STATE = CompileState()

"""python -m umst_tools.slurm_shim COMMAND [ARGS]: the shim's sbatch, srun, scontrol, squeue or scancel."""
import sys

from umst_tools.slurm_shim.commands import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))

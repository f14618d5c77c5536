"""``trainer.strategy: fsdp2``: fully sharded data parallelism through Lightning's own
``ModelParallelStrategy`` (FSDP2), set up for I-JEPA.

Lightning's ``fsdp`` (FSDP1) flattens each wrapped unit's parameters into one flat buffer and
shards that; the online and target encoders' slices would not line up, so the EMA update could
not pair them (and both Lightning and torch refuse FSDP1 on CPU). With FSDP2 every parameter is a
``DTensor`` sharded on its first dimension: ``IJEPA.configure_model`` shards the online encoder,
the target encoder and the predictor alike (``ijepa.nn.sharding``), and ``EMATargetUpdate``
updates the target shard by shard.
"""

from __future__ import annotations

from datetime import timedelta

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy, Strategy, StrategyRegistry


def refuse_fsdp1(strategy: Strategy) -> None:
    """Lightning's FSDP1 cannot pair the online and target encoders' shards: refuse it by name."""
    if isinstance(strategy, FSDPStrategy):
        raise ValueError(
            "trainer.strategy: fsdp (Lightning's FSDPStrategy, FSDP1) flattens the online and target encoders "
            "into shards that do not line up, so the EMA update cannot pair them; use trainer.strategy: fsdp2 "
            "(ijepa.strategy.FSDP2Strategy: FSDP2, each encoder sharded alike). See README, 'STL-10 and several GPUs'."
        )


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` as plain sharded data parallelism: every process
    (``devices`` x ``num_nodes``) trains on its own share of the data, and the parameters, their
    gradients and the optimizer state are sharded over all of them (tensor-parallel size 1).

    ``save_distributed_checkpoint=False`` (the default here, unlike Lightning's): checkpoints are
    one ordinary Lightning file, gathered on rank 0 and written through the trainer's
    ``CheckpointIO`` (the CLI's atomic writer), loadable in one process and by ``ijepa convert``.
    ``True`` writes a folder with one shard file per rank instead, for models whose full state
    does not fit in one host's memory.
    """

    def __init__(
        self,
        save_distributed_checkpoint: bool = False,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )

    def setup_environment(self) -> None:
        # Lightning's "auto" data-parallel size is the node count (tensor parallelism within a
        # node); here every process is a data-parallel rank.
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


if "fsdp2" not in StrategyRegistry:
    StrategyRegistry.register(
        "fsdp2", FSDP2Strategy, description="FSDP2 sharded data parallelism for I-JEPA (ijepa.strategy)"
    )

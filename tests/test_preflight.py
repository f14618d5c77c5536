"""Checks before anything is built or launched (:mod:`ijepa.preflight`): devices the machine does
not have, nodes nothing starts, data folders that do not exist; one line and exit status 2, from
the config alone (a 16-GPU preset used to start its processes and run the machine out of memory)."""

import pytest
from conftest import ROOT

from ijepa import preflight
from ijepa.cli import IJEPACLI, main
from ijepa.data import ImageFolderSource, ShardsSource, STL10Source, VideoFolderSource
from ijepa.option_errors import OptionError

PRESET = str(ROOT / "configs" / "presets" / "in1k_vith14_ep300.yaml")  # 8 GPUs x 2 nodes, an ImageNet folder


@pytest.fixture
def machine(monkeypatch):
    """This machine, whatever runs the tests: no GPU, 2 CPU cores, not in a cluster job; the
    classes are never built (so no process can be launched)."""
    monkeypatch.setattr("sys.argv", ["ijepa"])
    monkeypatch.setattr(preflight, "num_cuda_devices", lambda: 0)
    monkeypatch.setattr(preflight, "cpu_cores", lambda: 2)
    monkeypatch.setattr(preflight, "CLUSTERS", ())
    for variable in preflight.NODE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)

    def built(self):
        raise AssertionError("the classes were built: the checks came too late")

    monkeypatch.setattr(IJEPACLI, "instantiate_classes", built)
    return monkeypatch


def refused(capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--config", PRESET, *args])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_the_16_gpu_preset_on_a_machine_without_gpus_names_the_device_count_before_building_anything(machine, capsys):
    err = refused(capsys)
    assert err.startswith(
        "error: trainer.accelerator=gpu with trainer.devices=8, trainer.num_nodes=2 (8 x 2 = 16 GPUs): "
        "this machine has no GPU (0 CUDA devices);"
    ), err
    assert "--trainer.accelerator cpu --trainer.devices 1 (at most 2, its CPU cores)" in err


def test_the_preset_on_cpu_names_the_cpu_cores_as_the_range_of_trainer_devices(machine, capsys):
    err = refused(capsys, "--trainer.accelerator", "cpu")
    assert err == (
        "error: trainer.devices=8 with trainer.accelerator=cpu: this machine has 2 CPU cores, so trainer.devices "
        "must be 1 to 2 here (each device is a process)."
    )


def test_a_second_node_that_nothing_starts_is_refused_naming_trainer_num_nodes(machine, capsys):
    err = refused(capsys, "--trainer.accelerator", "cpu", "--trainer.devices", "2")
    assert err.startswith("error: trainer.num_nodes=2 (with trainer.devices=2 each): nothing starts the other 1 node")
    assert "trainer.num_nodes must be 1 here" in err


def test_a_missing_data_root_is_named_before_the_model_is_built_or_a_process_launched(machine, capsys, tmp_path):
    missing = tmp_path / "imagenet"
    one_device = ["--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.num_nodes", "1"]
    err = refused(capsys, *one_device, f"--data.source.root={missing}")
    assert err == f"error: image folder not found: data.source.root={str(missing)!r} is not a directory."


def test_more_gpus_than_the_machine_has_are_refused_with_the_range(machine):
    machine.setattr(preflight, "num_cuda_devices", lambda: 2)
    with pytest.raises(
        OptionError, match=r"^trainer\.devices=8 with trainer\.accelerator=gpu: this machine has 2 CUDA"
    ):
        preflight.check_devices("gpu", 8)
    with pytest.raises(OptionError, match=r"^trainer\.devices=0,3 \(device index 3\) .* must be 1 to 2, or -1 for all"):
        preflight.check_devices("cuda", "0,3")
    for fits in (2, "1", [0, 1], "-1", "auto", None):
        preflight.check_devices("gpu", fits)


def test_cpu_processes_up_to_the_cpu_cores_are_allowed_as_the_ddp_tests_run_them(machine):
    preflight.check_devices("cpu", 2)
    preflight.check_devices("auto", "2")
    preflight.check_nodes(1, 2)
    with pytest.raises(OptionError, match=r"^trainer\.devices=3 with trainer\.accelerator=cpu: this machine has 2 CPU"):
        preflight.check_devices("cpu", 3)


def test_a_launch_on_every_node_lets_trainer_num_nodes_above_1_through(machine):
    with pytest.raises(OptionError, match="trainer.num_nodes=2"):
        preflight.check_nodes(2, 8)
    preflight.check_nodes(2, 8, cluster=True)  # a cluster environment in trainer.plugins
    machine.setenv("NODE_RANK", "1")  # a launch by hand on every node
    preflight.check_nodes(2, 8)


@pytest.mark.parametrize(
    "source, message",
    [
        (lambda root: ImageFolderSource(root=str(root)), "image folder not found: data.probe_source.root="),
        (lambda root: VideoFolderSource(root=str(root)), "video folder not found: data.probe_source.root="),
        (lambda root: STL10Source(root=str(root)), "STL-10 not found: expected "),
        (lambda root: ShardsSource(root=str(root)), "shard folder not found: data.probe_source.root="),
    ],
)
def test_each_folder_source_checks_its_folder_without_reading_it(source, message, tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        source(tmp_path / "missing").check("data.probe_source")
    assert str(error.value).startswith(message) and "data.probe_source.root" in str(error.value)
    (tmp_path / "held" / "val").mkdir(parents=True)  # val/ without train/ is refused as splits() refuses it
    with pytest.raises(ValueError, match=r"has val/ but no train/ folder beside it"):
        ImageFolderSource(root=str(tmp_path / "held")).check()
    STL10Source(root=str(tmp_path / "missing"), download=True).check()  # prepare() fetches it first

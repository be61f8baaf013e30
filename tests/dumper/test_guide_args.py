"""The dumper's arguments as Ascend's guide spells them (accuracy/dumper/guide_args.py): what
`use_dump`, a folder `dump_path`, `use_load` and `load_file_path` mean, and what is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from accuracy import dumper, load_dump
from tests._support.guide import guide_names


def test_use_dump_false_records_nothing(in_tmp):
    names = guide_names()
    with dumper(use_dump=False, dump_path="./off.h5") as dump:
        names["model"](names["input"]).sum().backward()
    assert not Path("off.h5").exists()
    assert dump.ops_recorded == 0


def test_folder_dump_path_gets_dump_rank_file(in_tmp):
    os.mkdir("runs")
    with dumper(dump_path="runs"):
        torch.ones(3).exp()
    with dumper(dump_path="new_folder/"):  # a trailing slash names a folder to create
        torch.ones(3).exp()
    assert os.listdir("runs") == ["dump_0.h5"]
    assert os.listdir("new_folder") == ["dump_0.h5"]
    with pytest.raises(FileExistsError, match="dump_0.h5"):
        dumper(dump_path="runs").__enter__()


def test_a_new_path_without_suffix_is_a_folder(in_tmp):
    """`dump_path="out/run1"` (no trailing slash, not there yet) is a folder, as `runs/` is:
    it used to become an HDF5 file named `run1`. A name with a suffix stays a file."""
    with dumper(dump_path="out/run1"):
        torch.ones(3).exp()
    assert os.listdir("out/run1") == ["dump_0.h5"]
    with dumper(dump_path="plain.hdf5"):
        torch.ones(3).exp()
    assert Path("plain.hdf5").is_file()


def test_empty_or_none_load_file_path_means_no_load(in_tmp):
    for value in ("", None):
        d = dumper(dump_path=f"x{value!r}.h5", load_file_path=value)
        with d:
            torch.ones(2).exp()
        with load_dump(d.path) as dump:
            assert "load_file_path" not in dump.attrs


def test_use_load_needs_a_load_file(in_tmp):
    with pytest.raises(ValueError, match="use_load=True needs load_file_path"):
        dumper(use_load=True, dump_path="./", load_file_path="")



def test_load_with_acl_dump_is_refused_in_one_line(in_tmp):
    with pytest.raises(ValueError) as e:
        dumper(use_load=True, dump_path="./", load_file_path="./output.h5",
               load_with_acl_dump=True)
    msg = str(e.value)
    assert "\n" not in msg and "ACL" in msg and "Ascend" in msg
    assert not Path("dump_0.h5").exists()


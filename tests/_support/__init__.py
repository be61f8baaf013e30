"""What several test modules share: crafted files, workers started by path or module, servers."""

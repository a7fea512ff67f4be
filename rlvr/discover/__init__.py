"""TTT-Discover: test-time training on one problem over an archive of candidates (`trainer=discover`)."""

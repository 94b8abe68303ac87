"""Examples for `--model package.module:factory` and `--dataset package.module:loader`."""

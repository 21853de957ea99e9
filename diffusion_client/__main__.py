"""python -m diffusion_client: the same as the `diffusion` command."""
import sys

from diffusion_client.cli import main

sys.exit(main())

import sys

from dsbd_jax.cli import main

sys.exit(main())

import sys

from goodput_cli.main import main

sys.exit(main())

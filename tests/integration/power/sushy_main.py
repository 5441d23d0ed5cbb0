"""Run sushy-emulator with its fake driver's power-change delay fixed by PG_SUSHY_DELAY_S
(the stock driver waits a random 1-11 s; real BMCs are not that slow in every test)."""

import os
import random
import sys

from sushy_tools.emulator import main as emulator
from sushy_tools.emulator.resources.systems import fakedriver

if "PG_SUSHY_DELAY_S" in os.environ:
    delay = int(os.environ["PG_SUSHY_DELAY_S"])
    fake_random = random.Random()
    fake_random.randint = lambda a, b: delay  # type: ignore[method-assign]
    fakedriver.random = fake_random

if __name__ == "__main__":
    sys.exit(emulator.main())

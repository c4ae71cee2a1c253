"""The SDK's older name: ``from trainer import report`` is ``torchyard.report``, the same module object.

Scripts written before the SDK took the product's name keep working inside jobs, where the service is installed.
"""

import sys

from torchyard import report

sys.modules[__name__] = report

import glob
import os
import platform
import re
import warnings
from pkg_resources import DistributionNotFound, get_distribution, parse_version

"""`policy` where Pulumi runs the pack (policy/__main__.py, with this folder itself on sys.path): `import policy`
finds this file, not the folder's __init__.py. A module with `__path__` is a package (the import system's rule), so
`policy.rules_gke` is rules_gke.py beside this file there, as in the project; every module imports its siblings
one way. (The recipes package does the same with recipes/recipes.py.)"""

import os

__path__ = [os.path.dirname(os.path.abspath(__file__))]

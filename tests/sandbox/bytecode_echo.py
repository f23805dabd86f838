"""A stdlib-only program for test_bytecode: says what it was run as."""

import json
import sys

if __name__ == "__main__":
    print(json.dumps({"name": __name__, "argv": sys.argv[1:]}))

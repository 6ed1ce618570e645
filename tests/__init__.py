"""keepstep tests (a package so that tests.support imports without sys.path edits)."""

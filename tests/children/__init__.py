"""Child scripts the tests start in other processes."""

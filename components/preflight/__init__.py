"""The pre-flight component: checks a run can succeed before anything is downloaded or trained."""

# Read by ctest after the discovered GoogleTest tests (TEST_INCLUDE_FILES).
# Tests that time a simulated device against the host's clock run alone:
# under `ctest -j`, other tests' threads can hold up the engine loop they time
# by milliseconds, and the engine then rightly falls back to starting its
# steps early.
set_tests_properties(
  EngineLateContinuation.ARequestArrivingDuringAStepStartsInTheNext
  EngineLateContinuation.TheDeviceStaysBusy
  EngineLateContinuation.ATooLongEstimateLeavesTheDeviceIdleBriefly
  PROPERTIES RUN_SERIAL TRUE)

%% Shared by the suites and ecall_test_nodes.
-define(CALLERS, 1000).
-define(PER_CALLER, 100).

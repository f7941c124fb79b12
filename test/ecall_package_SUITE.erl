%% What the package says about itself: the defaults in the .app file are the
%% defaults of ecall_config:spec/0 and pass its checks, and the files a hex
%% package would hold exist. No nodes.
-module(ecall_package_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0]).
-export([env_is_the_spec_defaults/1, env_defaults_pass_validation/1,
         package_metadata/1]).

all() ->
    [env_is_the_spec_defaults, env_defaults_pass_validation, package_metadata].

%% The .app file as built, not the running environment (other suites change
%% that).
app_props() ->
    _ = application:load(ecall),
    File = filename:join(code:lib_dir(ecall, ebin), "ecall.app"),
    {ok, [{application, ecall, Props}]} = file:consult(File),
    Props.

spec_defaults() ->
    lists:sort([{Key, Default} || {Key, {_, Default, _, _}} <- maps:to_list(ecall_config:spec())]).

%% application:get_all_env(ecall) shows every setting with its default.
env_is_the_spec_defaults(_Config) ->
    Env = proplists:get_value(env, app_props()),
    ?assertEqual(spec_defaults(), lists:sort(Env)).

env_defaults_pass_validation(_Config) ->
    Before = application:get_all_env(ecall),
    try
        [application:unset_env(ecall, K) || {K, _} <- Before],
        [application:set_env(ecall, K, V) || {K, V} <- proplists:get_value(env, app_props())],
        ?assertEqual(ok, ecall_config:validate()),
        ?assertEqual(spec_defaults(), lists:sort(application:get_all_env(ecall)))
    after
        [application:unset_env(ecall, K) || {K, _} <- application:get_all_env(ecall)],
        [application:set_env(ecall, K, V) || {K, V} <- Before]
    end.

%% links and licenses are set, and every entry of `files' (what rebar3 hex
%% build would package) exists in the project.
package_metadata(_Config) ->
    Props = app_props(),
    ?assertMatch([_ | _], proplists:get_value(licenses, Props)),
    ?assertMatch([{_, "https://" ++ _} | _], proplists:get_value(links, Props)),
    Root = filename:dirname(filename:dirname(
                              proplists:get_value(source, ecall:module_info(compile)))),
    Files = proplists:get_value(files, Props),
    ?assertEqual([], [F || F <- Files, not filelib:is_file(filename:join(Root, F))]),
    ?assertEqual([], ["erlang_src", "native", "Cargo.toml", "Cargo.lock", "rebar.config",
                      "README.md", "LICENSE", "CHANGELOG.md", "doc"] -- Files),
    ?assert(filelib:is_regular(filename:join(Root, "native/build.sh"))).

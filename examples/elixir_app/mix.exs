defmodule EcallExample.MixProject do
  use Mix.Project

  def project do
    [
      app: :ecall_example,
      version: "0.1.0",
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      deps: deps()
    ]
  end

  def application do
    [extra_applications: [:logger], mod: {EcallExample.Application, []}]
  end

  # ecall is a rebar3 project: mix builds it with rebar3, whose compile hook
  # builds the NIF with cargo (ECALL_NO_NIF=1 builds without it). From git:
  #   {:ecall, git: "https://github.com/OWNER/ecall.git", branch: "main", manager: :rebar3}
  defp deps do
    [{:ecall, path: "../..", manager: :rebar3}]
  end
end

defmodule EcallExample do
  @moduledoc """
  ecall from Elixir: `:ecall.send/2`, `:ecall.cast/4` and `:ecall.call/4`
  between two nodes that both run this application (and so ecall).

  Start one node with `mix run --no-halt`, then from another:

      mix run -e 'EcallExample.main(:"b@myhost")'
  """

  @doc "Sends, casts and calls to `peer` through ecall; raises if anything is lost."
  def main(peer) do
    # Waits until every ecall link to the peer is up (it also connects the
    # nodes). Without an ecall connection, :ecall.send/2 is plain send/2
    # and call/4 goes through :erpc.
    :ok = :ecall.connect(peer)
    me = self()

    # :ecall.send/2 instead of send/2: returns the message, like send/2.
    {^me, :hello} = :ecall.send({EcallExample.Echo, peer}, {me, :hello})
    receive do
      {:echo, ^peer, :hello} -> IO.puts("send: #{inspect(peer)} echoed :hello")
    after
      5_000 -> raise "no echo from #{inspect(peer)}"
    end

    # :ecall.cast/4 instead of :erpc.cast/4: the peer runs send(me, ...).
    :ok = :ecall.cast(peer, Kernel, :send, [me, {:cast_ran, peer}])
    receive do
      {:cast_ran, ^peer} -> IO.puts("cast: ran on #{inspect(peer)}")
    after
      5_000 -> raise "the cast did not run on #{inspect(peer)}"
    end

    # :ecall.call/4 instead of :erpc.call/4: {:ok, result} or {:error, _}.
    {:ok, "HELLO"} = :ecall.call(peer, String, :upcase, ["hello"])
    {:ok, ^peer} = :ecall.call(peer, :erlang, :node, [])
    # A raise comes back with its class, reason and stack trace.
    {:error, {:exception, :error, :badarith, _}} = :ecall.call(peer, :erlang, :div, [1, 0])
    IO.puts("call: String.upcase(\"hello\") on #{inspect(peer)} gave \"HELLO\"")

    {:ok, stats} = :ecall.stats(peer)
    IO.puts("stats: transport #{stats.transport}, #{stats.requests} requests in #{stats.batches} batches")
    stats
  end
end

defmodule EcallExample.Echo do
  @moduledoc "Answers `{from, msg}` with `{:echo, node(), msg}`."
  use GenServer

  def start_link(_), do: GenServer.start_link(__MODULE__, nil, name: __MODULE__)

  @impl true
  def init(nil), do: {:ok, nil}

  @impl true
  def handle_info({from, msg}, state) when is_pid(from) do
    send(from, {:echo, node(), msg})
    {:noreply, state}
  end
end

defmodule EcallExample.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    Supervisor.start_link([EcallExample.Echo, EcallExample.PubSub],
      strategy: :one_for_one,
      name: EcallExample.Supervisor
    )
  end
end

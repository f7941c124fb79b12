defmodule EcallExample.PubSub do
  @moduledoc """
  A tiny pub/sub over `:pg` and `:ecall.send_group/3`: subscribers join a
  topic's group, and a broadcast goes to every subscriber on every node,
  as one request per node (its receiver there delivers to the node's
  subscribers).

      EcallExample.PubSub.subscribe(:news)
      EcallExample.PubSub.broadcast(:news, {:headline, "..."})
  """

  @scope :ecall_example_pubsub

  @doc "The `:pg` scope, for the application's supervisor."
  def child_spec(_), do: %{id: @scope, start: {:pg, :start_link, [@scope]}}

  @doc "The calling process subscribes to `topic`."
  def subscribe(topic), do: :pg.join(@scope, topic, self())

  @doc "Sends `msg` to every subscriber of `topic`, on every node."
  def broadcast(topic, msg), do: :ecall.send_group(@scope, topic, msg)

  @doc """
  `n` subscribers here and `n` on `peer` (through ecall's links) each get
  `count` broadcasts, once and in order; raises if not.
  """
  def demo(peer, n, count \\ 10) do
    :ok = :ecall.connect(peer)
    me = self()
    topic = {:demo, make_ref()}
    here = for _ <- 1..n, do: spawn_link(fn -> subscriber(topic, me) end)
    there = :erpc.call(peer, __MODULE__, :start_subscribers, [topic, n, me])
    wait_members(topic, 2 * n)
    for i <- 1..count, do: :ok = broadcast(topic, {:news, i})
    # Replayed on the peer after the broadcasts: once it answers, they
    # are in the subscribers' mailboxes there.
    {:ok, ^peer} = :ecall.call(peer, :erlang, :node, [])
    expected = for i <- 1..count, do: {:news, i}
    for s <- here ++ there do
      send(s, {:done, me})
      receive do
        {:got, ^s, ^expected} -> :ok
        {:got, ^s, other} -> raise "#{inspect(s)} got #{inspect(other)}"
      after
        10_000 -> raise "no answer from #{inspect(s)}"
      end
    end
    IO.puts("pubsub: #{2 * n} subscribers on 2 nodes got #{count} broadcasts each, in order")
  end

  @doc false
  def start_subscribers(topic, n, reporter) do
    for _ <- 1..n, do: spawn(fn -> subscriber(topic, reporter) end)
  end

  # A subscriber keeps what it gets until asked.
  defp subscriber(topic, _reporter) do
    :ok = subscribe(topic)
    collect([])
  end

  defp collect(got) do
    receive do
      {:news, _} = m -> collect([m | got])
      {:done, from} -> send(from, {:got, self(), Enum.reverse(got)})
    end
  end

  # pg tells other nodes of joins asynchronously: wait until this node
  # sees every subscriber.
  defp wait_members(topic, n, tries \\ 500) do
    cond do
      length(:pg.get_members(@scope, topic)) == n -> :ok
      tries == 0 -> raise "only #{length(:pg.get_members(@scope, topic))} of #{n} subscribers seen"
      true ->
        Process.sleep(10)
        wait_members(topic, n, tries - 1)
    end
  end
end

"""The decode thread hands a round's events to the event loop in one wake-up."""

import asyncio
import threading

from cardjax.serve.handoff import Handoff


def test_a_rounds_events_arrive_in_order_with_one_wake_up():
  async def main():
    loop = asyncio.get_running_loop()
    handoff, queues = Handoff(), [asyncio.Queue(), asyncio.Queue()]
    wakeups = []
    real = loop.call_soon_threadsafe

    def counting(*args):
      wakeups.append(args)
      return real(*args)

    loop.call_soon_threadsafe = counting

    def decode_thread():
      for step in range(3):
        for i, q in enumerate(queues):
          handoff.put(loop, q, (i, step))
      assert queues[0].empty()  # nothing is handed over before the flush
      handoff.flush()
      handoff.flush()  # nothing pending: no wake-up

    thread = threading.Thread(target=decode_thread)
    thread.start()
    await asyncio.to_thread(thread.join)
    got = [[await q.get() for _ in range(3)] for q in queues]
    assert got == [[(0, s) for s in range(3)], [(1, s) for s in range(3)]]
    assert [w[0].__name__ for w in wakeups].count("_drain") == 1  # to_thread's own aside

  asyncio.run(main())


def test_a_closed_loop_is_skipped():
  loop = asyncio.new_event_loop()
  loop.close()
  handoff = Handoff()
  handoff.put(loop, None, "x")
  handoff.flush()  # no error: nobody is listening any more

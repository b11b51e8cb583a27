"""Download: videos in; media/, subs/ and one ``downloads`` row per video out.

- files.py: what one video's download leaves on disk (options, subtitle tracks, media, caps),
  and a folder source's files
- stage.py: the stage: a batch of videos through the breaker, the network watch and the
  download slots; HTTP 403s and hosts that did not resolve judged once the batch is over
- ytdlp.py: what discover and download share about yt-dlp: options, egresses, logging, and
  the classification of its errors
- ytdlp_args.py: yt-dlp's own command-line options read into its Python API options
- breaker.py: the circuit breaker that pauses downloads when a site blocks the session
- outage.py: the network watch that pauses downloads, and discover's searches and playlists,
  while the network is down
- gone_hosts.py: a host judged gone only from evidence across runs
- limits.py: what tasks running side by side share: concurrency slots, request rates, the
  breaker's and the network watch's states (flows/ installs a cluster-wide backend)
"""

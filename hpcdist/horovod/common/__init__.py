"""What the framework modules of :mod:`hpcdist.horovod` share: start-up and the world's
shape (:mod:`.basics`), process sets (:mod:`.process_sets`), the collective runner
(:mod:`.runner`) and Horovod's exception names (:mod:`.exceptions`)."""

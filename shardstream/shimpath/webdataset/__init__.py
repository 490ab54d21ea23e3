"""`import webdataset` in a child process of one that ran `shardstream.install_as_webdataset()`
(or `python -m shardstream.run`): multiprocessing's spawn and forkserver start their children
with the parent's `sys.path`, on which the install put this directory first, and the children
import their parent's main module (its `import webdataset`) before they unpickle anything. This
module puts shardstream in its place, so a DataLoader worker runs the script on shardstream as
its parent does. It is never on `sys.path` otherwise.
"""

import shardstream

shardstream.install_as_webdataset(force=True)  # (sys.modules["webdataset"] is now shardstream: the import returns it)

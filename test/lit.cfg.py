# -*- Python -*-
import os

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "FASTLLM"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".onnxtext", ".test"]
config.excludes = ["Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.fastllm_obj_root, "test")

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%python", config.python3))
config.substitutions.append(("%src_root", config.fastllm_src_root))

llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.fastllm_tools_dir, append_path=True)

tools = [ToolSubst("fastllm-opt", unresolved="fatal")]
llvm_config.add_tool_substitutions(tools, [config.fastllm_tools_dir])
config.substitutions.append(
    ("%expect_exit",
     f"{config.python3} {os.path.join(config.fastllm_src_root, 'test', 'expect_exit.py')}"))
